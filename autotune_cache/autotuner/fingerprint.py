"""Environment fingerprints: which FlashInfer would accept a cache file's ``_metadata``.

FlashInfer (0.7.2.post1, ``AutoTuner.load_configs``) ignores a whole cache file when any field
of its ``_metadata`` disagrees with ``_collect_metadata()`` of the process loading it. Whether an
entry is *stale* is therefore a question about the environment that will load it - the serving
image on its GPU - not about whatever machine runs ``ls``:

* ``fi-autotune env --json`` captures a fingerprint (exactly FlashInfer's fields, read by
  FlashInfer itself); it is the only place here that imports flashinfer (and so torch).
* ``--env-from FILE`` compares entries with a fingerprint captured elsewhere, on any machine,
  without flashinfer.
* A field the fingerprint could not read (``unknown``) never makes an entry stale: we report it
  as unknown instead. A host without a GPU cannot stand for any serving environment at all, so
  staleness is refused there unless a fingerprint is given.

The comparison mirrors ``_classify_metadata_mismatches`` (tests/autotuner/test_fingerprint.py checks it
against FlashInfer's own function, case by case).
"""

from __future__ import annotations

import glob
import json
import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from autotune_cache.errors import UsageError
from autotune_cache.safeopen import FileRefused, read_bounded

#: ``--env-from``'s cap: ``env --json`` writes a few KiB; a rank file (its ``_metadata``) can be MiBs.
MAX_ENV_FILE_BYTES = 64 << 20

#: ``_collect_metadata()``'s fields, in its order.
FIELDS = (
    "flashinfer_version",
    "cuda_version",
    "cublas_version",
    "cudnn_version",
    "cudnn_frontend_version",
    "cutlass_dsl_version",
    "gpu",
)
#: FlashInfer's ``_INDETERMINATE_META_VALUES``: a field the writer could not read.
INDETERMINATE = (None, "unknown", "None")
WILDCARD = "*"
FORMAT = 1
#: ``env --json``'s envelope (cli/output.py's ``json_format("env")``); files written before the
#: envelopes carry the bare ``FORMAT`` number, and are read alike.
ENVELOPE = f"fi-autotune.env/{FORMAT}"


def _format_number(value: object) -> int | None:
    """1 for ``1`` or ``"fi-autotune.env/1"``; None for anything else."""
    if type(value) is int:
        return value
    if isinstance(value, str) and value.startswith("fi-autotune.env/") and value[16:].isdigit():
        return int(value[16:])
    return None


def is_known(value: object) -> bool:
    return value not in INDETERMINATE


@dataclass(frozen=True)
class EnvVerdict:
    """How one file's ``_metadata`` fares against a fingerprint."""

    #: field -> (saved, target): FlashInfer in the target environment ignores the file for these.
    mismatched: dict = field(default_factory=dict)
    #: field -> (saved, target) where the target's value is unknown: cannot tell.
    unknown: dict = field(default_factory=dict)

    @property
    def stale(self) -> bool:
        return bool(self.mismatched)

    def describe(self) -> str:
        parts = [f"{k}: {saved!r} vs {target!r}" for k, (saved, target) in self.mismatched.items()]
        return ", ".join(parts)


@dataclass(frozen=True)
class Fingerprint:
    """One environment's values of FlashInfer's metadata fields, and where they came from."""

    fields: dict
    source: str  # "this host", "--env-from FILE"
    arch: str | None = None
    gpus: tuple = ()
    host: str | None = None
    captured: str | None = None

    @property
    def has_gpu(self) -> bool:
        return is_known(self.fields.get("gpu"))

    @property
    def gpu(self) -> str | None:
        value = self.fields.get("gpu")
        return value if is_known(value) else None

    @property
    def unknown(self) -> list[str]:
        """What this environment could not be read for (FlashInfer's fields, and the GPU's arch):
        a fingerprint with any cannot stand for a serving environment."""
        return [f for f, v in self.fields.items() if not is_known(v)] + ([] if self.arch else ["arch"])

    def compare(self, saved: object) -> EnvVerdict:
        """What FlashInfer with this fingerprint would say of a file's ``_metadata``.

        A file without ``_metadata`` is loaded without a check. A corrupt (non-object) one counts
        as every field missing, as in FlashInfer.
        """
        if saved is None or saved == {}:
            return EnvVerdict()
        if not isinstance(saved, dict):
            saved = {}
        mismatched, unknown = {}, {}
        for name, target in self.fields.items():
            value = saved.get(name)
            if value == target or value == WILDCARD:
                continue
            (mismatched if is_known(target) else unknown)[name] = (value, target)
        return EnvVerdict(mismatched, unknown)

    def to_dict(self) -> dict:
        return {
            "format": ENVELOPE,
            "tool": "fi-autotune env",
            "fingerprint": dict(self.fields),
            "arch": self.arch,
            "gpus": list(self.gpus),
            "host": self.host,
            "captured": self.captured,
            "unknown": self.unknown,
        }

    @classmethod
    def load(cls, path: str | Path) -> "Fingerprint":
        """From ``fi-autotune env --json`` output, a rank file (its ``_metadata``), or a plain
        object of FlashInfer's fields. Anything else is a usage error (exit 2)."""
        try:  # a regular file of at most 16 MiB: never a FIFO's open or /dev/zero's read
            obj = json.loads(read_bounded(path, MAX_ENV_FILE_BYTES, what="--env-from file"))
        except FileRefused as e:
            raise UsageError(f"--env-from {e}") from None
        except OSError as e:
            raise UsageError(f"--env-from {path}: {e.strerror or e}") from None
        except (ValueError, RecursionError):
            raise UsageError(f"--env-from {path}: not JSON (expected `fi-autotune env --json` output)") from None
        source = f"--env-from {path}"
        if isinstance(obj, dict) and isinstance(obj.get("fingerprint"), dict):
            number = _format_number(obj.get("format", FORMAT))
            if number is None or number > FORMAT:
                raise UsageError(f"--env-from {path}: written by a newer fi-autotune (format {obj.get('format')})")
            return cls(_checked(obj["fingerprint"], path), source, obj.get("arch"), tuple(obj.get("gpus") or ()),
                       obj.get("host"), obj.get("captured"))
        if isinstance(obj, dict) and isinstance(obj.get("_metadata"), dict):
            return cls(_checked(obj["_metadata"], path), source)
        if isinstance(obj, dict):
            return cls(_checked(obj, path), source)
        raise UsageError(f"--env-from {path}: not a fingerprint (expected `fi-autotune env --json` output)")


def _checked(fields: dict, path) -> dict:
    missing = [f for f in FIELDS if f not in fields]
    if missing:
        raise UsageError(f"--env-from {path}: not a fingerprint, lacks {', '.join(missing)}")
    return {f: fields[f] for f in FIELDS}


def this_host(gpu_index: int = 0) -> Fingerprint:
    """This host's fingerprint, read by FlashInfer's own ``_collect_metadata`` (imports torch).

    Raises UsageError when flashinfer cannot be imported: there is no FlashInfer here whose
    verdict we could report.
    """
    try:
        # flashinfer first: where it is missing, this fails before torch's seconds of import
        from flashinfer.autotuner.autotuner import _collect_metadata
        import torch
    except Exception as e:  # noqa: BLE001 - ImportError, or a CUDA library failing to load
        raise UsageError(
            f"flashinfer is not importable here ({type(e).__name__}: {str(e)[:120]}): run `fi-autotune env` "
            "in the serving image, or compare with a captured fingerprint (--env-from)"
        ) from None
    from datetime import datetime, timezone

    meta = _collect_metadata()
    gpus = []
    arch = None
    try:
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(i)
                uuid = getattr(props, "uuid", None)
                gpus.append({"index": i, "name": props.name, "uuid": str(uuid) if uuid is not None else None})
            major, minor = torch.cuda.get_device_capability(gpu_index)
            arch = f"sm{major}{minor}"
    except Exception:  # noqa: BLE001 - a broken driver leaves the fields as FlashInfer read them
        pass
    return Fingerprint({f: meta.get(f) for f in FIELDS}, "this host", arch, tuple(gpus), socket.gethostname(),
                       datetime.now(timezone.utc).isoformat(timespec="seconds"))


#: The device nodes through which torch reaches a GPU on Linux: the NVIDIA driver's (a container
#: with a GPU has them mounted) and its ``/proc`` entry; WSL 2's ``/dev/dxg``; Jetson's (Tegra's
#: nvgpu driver: ``/dev/nvhost-*``, ``/dev/nvgpu/...``, ``/dev/nvmap``, and no ``/dev/nvidia*`` on
#: Nano and Xavier); ROCm's ``/dev/kfd`` (``torch.cuda`` is HIP there).
CUDA_DEVICE_PATHS = ("/dev/nvidiactl", "/dev/nvidia[0-9]*", "/proc/driver/nvidia", "/dev/dxg",
                     "/dev/nvhost-*", "/dev/nvgpu*", "/dev/nvmap", "/dev/kfd")
#: Where an NVIDIA GPU shows before its driver is loaded (``nvidia-modprobe`` loads it and makes the
#: nodes at CUDA's first call): a PCI device of vendor 0x10de and class 0x03 (a display controller).
PCI_DEVICES = "/sys/bus/pci/devices"


def cuda_device_possible() -> bool:
    """False only where torch cannot see a GPU, whatever is installed: Linux with none of
    ``CUDA_DEVICE_PATHS`` and no NVIDIA display controller on the PCI bus. There FlashInfer's
    ``gpu`` field reads "unknown" (its ``torch.cuda.get_device_name`` raises), so a GPU-less host's
    verdict needs no torch import (seconds). Anywhere else (another OS, a node present, a bus that
    cannot be read) this is True and FlashInfer is asked."""
    if not sys.platform.startswith("linux"):
        return True
    return any(glob.glob(pattern) for pattern in CUDA_DEVICE_PATHS) or _nvidia_gpu_on_the_pci_bus()


def _nvidia_gpu_on_the_pci_bus() -> bool:
    try:
        devices = os.listdir(PCI_DEVICES)
    except OSError:
        return True  # no view of the bus: cannot rule a GPU out
    for name in devices:
        try:
            with open(os.path.join(PCI_DEVICES, name, "vendor")) as f:
                vendor = f.read().strip()
            if vendor != "0x10de":
                continue
            with open(os.path.join(PCI_DEVICES, name, "class")) as f:
                if f.read().strip().startswith("0x03"):
                    return True
        except OSError:
            return True  # a device that cannot be read might be one
    return False


def fingerprint_for_staleness(env_from: str | None, *, required: bool) -> Fingerprint | None:
    """The fingerprint ``ls``/``show``/``prune`` judge staleness against, or None.

    ``env_from`` wins. Otherwise this host, if it has a GPU; a host without one is no serving
    environment: ``required`` (``--status stale`` asks for a verdict) makes that a usage error,
    else None and the caller says why nothing is marked stale. A host where torch can reach no
    device (``cuda_device_possible``) is GPU-less whether or not FlashInfer imports there, and is
    told so without importing it.
    """
    if env_from:
        return Fingerprint.load(env_from)
    if cuda_device_possible():  # else this_host() would read gpu "unknown": no torch import to learn it
        fp = this_host()
        if fp.has_gpu:
            return fp
    if required:
        raise UsageError(NO_GPU_STALENESS)
    return None


NO_GPU_STALENESS = (
    "this host has no GPU, so no engine loads these caches here and nothing can be called stale; "
    "run `fi-autotune env --json > env.json` in the serving image on the target GPU and pass --env-from env.json"
)
