"""The entry filters ``ls``, ``prune`` and ``export`` share (model, model pattern, versions, archs,
statuses, ages, sizes), the filter they make, and the fingerprint staleness is judged against."""

from __future__ import annotations

import click

from autotune_cache.autotuner.fingerprint import Fingerprint, is_known
from autotune_cache.autotuner.installed import VERSION_RE, installed_flashinfer_version
from autotune_cache.humanize import parse_size
from autotune_cache.tree.select import EntryFilter, judged_against
from autotune_cache.tree.status import EntryStatus

from .params import ARCHS, DURATION, STATUSES, VERSIONS, flatten


FILTER_HELP = {
    "model": "Only entries served as this model path, exactly as plan, check and pull take --model "
             "(zai-org/GLM-5.1 is not zai-org/GLM-5.1-FP8; entries without a manifest have none).",
    "model_glob": "Only entries whose model path matches this shell pattern, any case: * ? [..] "
                  "('*GLM-5.1*' takes GLM-5.1 and GLM-5.1-FP8; quote it from the shell).",
    "versions": "Only these FlashInfer versions (comma-separated or repeated), matched exactly: 0.7.2 is not "
                "0.7.2.post1 (ls names the versions the tree holds when none matches).",
    "arch": "Only these archs, e.g. sm90,sm100 (comma-separated or repeated, any case).",
    "status": "Only these statuses: " + ", ".join(EntryStatus.names()) + " (comma-separated or repeated).",
    "older_than": "Only entries not modified for this long: a number with s, m, h, d or w, any case, or "
                  "their long forms (30d, 12h, 90min, 2 weeks); a bare number is refused.",
    "unused_for": "Only entries no engine has read for this long, from access times (30d). Where the "
                  "filesystem keeps no access times (noatime mounts), or a copy left them (every entry read within "
                  "seconds: rsync, a restore), last use is unknown and nothing is selected, with a note; "
                  "relatime (the Linux default) is exact to a day.",
}


def filter_options(fn):
    """The filters ``ls``, ``prune`` and ``export`` share."""
    options = [
        click.option("--model", default=None, help=FILTER_HELP["model"]),
        click.option("--model-glob", default=None, metavar="PATTERN", help=FILTER_HELP["model_glob"]),
        click.option("--flashinfer-version", "versions", multiple=True, type=VERSIONS, help=FILTER_HELP["versions"]),
        click.option("--arch", multiple=True, type=ARCHS, help=FILTER_HELP["arch"]),
        click.option("--status", multiple=True, type=STATUSES, help=FILTER_HELP["status"]),
        click.option("--older-than", type=DURATION, default=None, help=FILTER_HELP["older_than"]),
        click.option("--unused-for", type=DURATION, default=None, help=FILTER_HELP["unused_for"]),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


size_filter_options = [
    click.option("--larger-than", default=None, metavar="SIZE",
                 help="Entries taking more than SIZE on disk (50M, 1G, 10GiB; a unit is required, any case), "
                      "as docker's and hf's size filters."),
    click.option("--smaller-than", default=None, metavar="SIZE", help="Entries taking less than SIZE on disk."),
]


def size_filters(fn):
    """``--larger-than``/``--smaller-than`` (``ls``, ``prune``): sizes parsed by ``humanize.parse_size``."""
    for option in reversed(size_filter_options):
        fn = option(fn)
    return fn


def entry_filter(model, versions, arch, status, older_than, unused_for, other_versions_than=None, *,
                 larger_than: str | None = None, smaller_than: str | None = None,
                 model_glob: str | None = None) -> EntryFilter:
    return EntryFilter(
        model_glob=model_glob or None,
        larger_than=None if larger_than is None else parse_size(larger_than),
        smaller_than=None if smaller_than is None else parse_size(smaller_than),
        model=model or None,
        flashinfer_versions=flatten(versions),
        archs=flatten(arch),
        statuses=tuple(EntryStatus(s) for s in flatten(status)),
        older_than=older_than,
        unused_for=unused_for,
        other_versions_than=other_versions_than,
    )


def staleness_fingerprint(env_from: str | None, check_env: bool, flt: EntryFilter, out):
    """The fingerprint to judge staleness against, or None (``tree.select.judged_against``),
    its warning said on stderr."""
    fp, warning = judged_against(flt, env_from, check_env)
    if warning:
        out.warn(warning)
    return fp


def keep_latest_version(env_from: str | None) -> str | None:
    """The FlashInfer version ``prune --keep-latest`` keeps first: the serving image's
    (``--env-from``), else the one installed here, read from package metadata (no import)."""
    if env_from:
        value = Fingerprint.load(env_from).fields.get("flashinfer_version")
    else:
        value = installed_flashinfer_version()
    return value if isinstance(value, str) and is_known(value) and VERSION_RE.match(value) else None
