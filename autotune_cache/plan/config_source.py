"""Where a model's config.json comes from, in the order a user expects, always saying which.

1. ``--config`` (a config.json, or a directory holding one)
2. ``--model`` when it is a local directory (what the server would load)
3. the Hugging Face cache, then the hub, through ``huggingface_hub`` (``HF_HOME``,
   ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE`` and ``--revision`` honoured; only config.json and,
   for ModelOpt checkpoints, hf_quant_config.json are fetched, never weights)
4. the presets shipped in this package, keyed by hub id, so the models we care about plan
   offline.

ModelOpt checkpoints keep their quantization in ``hf_quant_config.json`` beside config.json;
it is read from the same place as the config.
"""

from __future__ import annotations

import difflib
import json
import os
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlparse

from autotune_cache.errors import UsageError

CONFIG_NAME = "config.json"
QUANT_SIDECAR_NAME = "hf_quant_config.json"
PRESETS_DIR = Path(__file__).with_name("presets")


@dataclass(frozen=True)
class ConfigSource:
    kind: str  # config-file | local-model | hf-cache | hf-hub | preset
    location: str
    config: dict = field(repr=False)
    quant_sidecar: dict | None = field(default=None, repr=False)
    #: The keys a server's config override flag set (``with_overrides``), for messages.
    overrides: tuple[str, ...] = ()

    def describe(self) -> str:
        labels = {
            "config-file": "--config",
            "local-model": "local model directory",
            "hf-cache": "Hugging Face cache",
            "hf-hub": "Hugging Face hub",
            "preset": "built-in preset",
        }
        side = f" (+ {QUANT_SIDECAR_NAME})" if self.quant_sidecar else ""
        over = f" (overridden by the serving command: {', '.join(self.overrides)})" if self.overrides else ""
        return f"{labels[self.kind]}: {self.location}{side}{over}"

    def to_dict(self) -> dict:
        out = {"kind": self.kind, "location": self.location, "quant_sidecar": self.quant_sidecar is not None}
        return out | ({"overrides": list(self.overrides)} if self.overrides else {})


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} is not a JSON object")
    return data


def _from_dir(directory: Path, kind: str, location: str) -> ConfigSource:
    sidecar = directory / QUANT_SIDECAR_NAME
    return ConfigSource(kind, location, _read_json(directory / CONFIG_NAME),
                        _read_json(sidecar) if sidecar.is_file() else None)


def preset_ids() -> list[str]:
    sidecar_suffix = "." + QUANT_SIDECAR_NAME.removesuffix(".json")
    return sorted(p.stem.replace("--", "/") for p in PRESETS_DIR.glob("*.json") if not p.stem.endswith(sidecar_suffix))


def _preset(model: str) -> ConfigSource | None:
    stem = model.strip("/").replace("/", "--")
    path = PRESETS_DIR / f"{stem}.json"
    if "/" not in model or not path.is_file():
        return None
    sidecar = PRESETS_DIR / f"{stem}.{QUANT_SIDECAR_NAME}"
    return ConfigSource("preset", model, _read_json(path), _read_json(sidecar) if sidecar.is_file() else None)


def _looks_like_repo_id(model: str) -> bool:
    parts = model.split("/")
    return len(parts) == 2 and all(parts) and not model.startswith((".", "~"))


def _hub_reachable() -> bool:
    """A DNS lookup of the hub endpoint: without it, huggingface_hub retries for ~25 s."""
    from huggingface_hub import constants

    host = urlparse(constants.ENDPOINT).hostname
    if not host:
        return False
    try:
        socket.getaddrinfo(host, 443)
        return True
    except OSError:
        return False


def _from_hf(model: str, revision: str | None) -> tuple[ConfigSource | None, str | None]:
    """(source, why not): the local HF cache first, then the hub unless offline."""
    try:
        import huggingface_hub
        from huggingface_hub import constants, try_to_load_from_cache
    except ImportError:
        return None, "huggingface_hub is not installed"

    cached = try_to_load_from_cache(model, CONFIG_NAME, revision=revision)
    if isinstance(cached, str):
        side = try_to_load_from_cache(model, QUANT_SIDECAR_NAME, revision=revision)
        return ConfigSource("hf-cache", cached, _read_json(Path(cached)),
                            _read_json(Path(side)) if isinstance(side, str) else None), None
    if constants.HF_HUB_OFFLINE:
        return None, "not in the Hugging Face cache and HF_HUB_OFFLINE is set"
    if not _hub_reachable():
        return None, "not in the Hugging Face cache and the hub is unreachable"
    try:
        path = huggingface_hub.hf_hub_download(model, CONFIG_NAME, revision=revision)
    except Exception as e:  # noqa: BLE001 - any hub failure falls through to the presets
        return None, f"hub: {type(e).__name__}"
    sidecar = None
    try:
        sidecar = _read_json(Path(huggingface_hub.hf_hub_download(model, QUANT_SIDECAR_NAME, revision=revision)))
    except Exception:  # noqa: BLE001 - most checkpoints have none
        pass
    return ConfigSource("hf-hub", f"{model}@{revision or 'main'}", _read_json(Path(path)), sidecar), None


def load_model_config(model: str, config: str | None = None, revision: str | None = None,
                      model_path: str | None = None) -> ConfigSource:
    """Where the config comes from is one question; the path the server is launched with
    (``model_path``, hashed into the key) is another: an image serving ``/models/GLM-5.1-FP8``
    plans from ``--config`` or a hub id and ``--model-path /models/GLM-5.1-FP8``."""
    if config is not None:
        p = Path(config)
        if p.is_dir():
            if not (p / CONFIG_NAME).is_file():
                raise UsageError(f"--config {config}: no {CONFIG_NAME} in that directory")
            return _from_dir(p, "config-file", str(p / CONFIG_NAME))
        if not p.is_file():
            raise UsageError(f"--config {config}: no such file")
        sidecar = p.with_name(QUANT_SIDECAR_NAME)
        return ConfigSource("config-file", str(p), _read_json(p), _read_json(sidecar) if sidecar.is_file() else None)
    local = Path(os.path.expanduser(model))
    if local.is_dir():
        if not (local / CONFIG_NAME).is_file():
            raise UsageError(f"--model {model} is a directory without {CONFIG_NAME}")
        return _from_dir(local, "local-model", str(local))
    if model.startswith(("/", "./", "../", "~")):
        served = model_path or model
        raise UsageError(
            f"--model {model} is not a directory on this machine: to plan for a server launched with "
            f"--model-path {served}, give the config's source as --config PATH/config.json (or --model <hub id or "
            f"preset>) together with --model-path {served}"
        )
    why = "not a local directory"
    if _looks_like_repo_id(model):
        source, why = _from_hf(model, revision)
        if source is not None:
            return source
    preset = _preset(model)
    if preset is not None:
        return preset
    near = close_presets(model)
    raise UsageError(
        f"no config for {model!r} ({why}, no built-in preset): pass --config PATH/config.json, "
        "a local model directory as --model, or make it reachable in the Hugging Face cache/hub",
        hint=(f"did you mean {' or '.join(near)}?" if near else "`fi-autotune plan --list-presets` lists the presets"),
    )


def close_presets(model: str, n: int = 3) -> list[str]:
    """The built-in presets nearest a mistyped model id (case and the org part forgiven)."""
    ids = preset_ids()
    by_lower = {i.lower(): i for i in ids}
    names = {i.lower().split("/")[-1]: i for i in ids}
    want = model.lower()
    found = difflib.get_close_matches(want, list(by_lower), n=n, cutoff=0.75)
    found += difflib.get_close_matches(want.split("/")[-1], list(names), n=n, cutoff=0.75)
    return list(dict.fromkeys(by_lower.get(f) or names[f] for f in found))[:n]


#: Override keys whose dict value is merged into the current one rather than replacing it.
_MERGED_ROPE = ("rope_scaling", "rope_parameters")


def with_overrides(source: ConfigSource, overrides: dict | None, *, merge_rope: bool) -> ConfigSource:
    """The config as the server reads it after its override flag (SGLang's
    ``--json-model-override-args``: ``utils/hf_transformers/config.py get_config``; vLLM's
    ``--hf-overrides``: ``config/model.py _apply_dict_overrides``): each key set at the top level,
    except a dict given for a nested config (a dict holding its own ``model_type``), which updates
    it, and - SGLang only (``merge_rope``) - ``rope_scaling`` / ``rope_parameters``, merged."""
    if not overrides:
        return source
    config = dict(source.config)
    for key, value in overrides.items():
        current = config.get(key)
        nested = isinstance(current, dict) and "model_type" in current
        if isinstance(value, dict) and (nested or (merge_rope and key in _MERGED_ROPE and isinstance(current, dict))):
            config[key] = {**current, **value}
        else:
            config[key] = value
    return replace(source, config=config, overrides=tuple(sorted(overrides)))
