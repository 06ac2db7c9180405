"""A serving command rebuilt from the arguments a server logged at startup.

``doctor`` names the command that makes the server's next boot a hit: ``fi-autotune warm --
<the server's own command>``. Each engine reads its own log line back into its own flags
(``engines/<engine>/serving_command.py``'s ``command_from_logged_args``); the spelling rules they
share are here: the long spelling the engine documents, only values that differ from a default,
and never a flag that would turn autotuning off."""

from __future__ import annotations

#: Dests left out of a rebuilt command: they turn autotuning off (never so in a log that tuned).
SKIP = {"disable_flashinfer_autotune", "enable_deterministic_inference", "enable_flashinfer_autotune",
         "optimization_level", "kernel_config", "model_tag", "model"}
#: Sizes whose value 1 is the default.
SIZES = {"tp_size", "pp_size", "dp_size", "attn_dp_size", "ep_size", "tensor_parallel_size",
          "pipeline_parallel_size", "data_parallel_size"}


def spelling(options: tuple[str, ...], dest: str) -> str:
    own = "--" + dest.replace("_", "-")
    return own if own in options else max(options, key=len)


def flag_words(spelled: str, value) -> list[str]:
    if value is True:
        return [spelled]
    if isinstance(value, (list, tuple)):
        return [spelled, *(str(v) for v in value)] if value else []
    return [spelled, str(value)]


def wanted(dest: str, value) -> bool:
    if dest in SKIP or value is None or value is False or value == "" or value == [] or value == ():
        return False
    if dest in SIZES and value == 1:
        return False
    return not (isinstance(value, str) and value == "auto" and dest != "model_path")
