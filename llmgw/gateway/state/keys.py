"""Who holds which key: the keys file (LLMGW_KEYS_FILE) or the plain digest file
(LLMGW_API_KEYS_FILE), read at start and again whenever the file is replaced.

keys.yaml names each key (`name` is what metrics and logs show, never the key), the models
it may use (names, aliases or globs; absent: all), and its limits. The plain file is a list
of anonymous digests that open everything, as it always was.

A replaced file that cannot be read or does not hold is refused and the old keys keep
working: a typo in a pull request must not lock every team out at once.

The keys last read well are kept beside the file as `.NAME.last-good`, as the plan is. A
worker that starts while the file is bad (gunicorn replacing one that died) takes those and
reports the same refusal as the workers already running; without them it failed to boot,
and gunicorn stops the whole gateway when a worker cannot load the app.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import fnmatch
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmgw.atomic import file_signature, replace_file
from llmgw.errors import UsageError
from llmgw.load import MAX_FILE_BYTES, parsed_or_refused
from llmgw.schema import dates_as_text, first_error_path

log = logging.getLogger("llmgw.gateway")

_HEX64 = re.compile(r"^[0-9a-f]{64}$")  # the plain digest file's lines, which have no schema
# What each field of keys.yaml must be, said to the operator; whether it is, the schema decides
# (schema/keys.schema.json), as it does for lint and editors: checks written here by hand once
# let a name with a trailing newline through that the schema refused.
_FIELD_SENTENCES = {
    "name": "`name` must be letters, digits, '.', '_' or '-', at most 63 (it labels metrics)",
    "sha256": "`sha256` must be the key's SHA-256 in hex on one line; `llmgw keys add` writes one",
    "models": "`models` must be a list of model names, aliases or globs",
    "rpm": "`rpm` must be a whole number of 1 or more; leave it out for no limit",
    "tpm": "`tpm` must be a whole number of 1 or more; leave it out for no limit",
    "expires": "`expires` must be a date, e.g. 2027-01-31",
    "priority": "`priority` must be high, normal or low; leave it out for normal",
    "share": "`share` must be a number greater than 0, e.g. 1 or 2.5; leave it out for 1",
    "budget": (
        "`budget` must be `{tokens: N, every: day | week | month}`, with an optional `warn_at` "
        "between 0 and 1 (e.g. 0.8)"
    ),
}


@dataclass(frozen=True)
class Budget:
    """Tokens a key may use per calendar period, in UTC; `warn_at` the used fraction past
    which the gateway logs one warning a period."""

    tokens: int
    every: str  # day, week (from Monday) or month
    warn_at: float | None = None

    def period(self, now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
        """The period `now` (UTC) falls in: its first instant and the next period's."""
        day = dt.datetime(now.year, now.month, now.day, tzinfo=dt.UTC)
        if self.every == "day":
            return day, day + dt.timedelta(days=1)
        if self.every == "week":
            start = day - dt.timedelta(days=day.weekday())
            return start, start + dt.timedelta(days=7)
        start = day.replace(day=1)
        if start.month == 12:
            return start, start.replace(year=start.year + 1, month=1)
        return start, start.replace(month=start.month + 1)

    def describe(self) -> str:
        """As a sentence says it: `100000 tokens a month`."""
        return f"{self.tokens} tokens a {self.every}"


def rfc3339(moment: dt.datetime) -> str:
    """UTC, to the second, with Z: as x-llmgw-budget-reset and the 429's sentence say it."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Tenant:
    """One key's holder, as metrics, logs and limits know it."""

    name: str
    models: tuple[str, ...] | None = None  # names, aliases or globs; None: every model
    rpm: int | None = None
    tpm: int | None = None
    expires: dt.date | None = None
    budget: Budget | None = None
    # Fair scheduling (gateway/schedule/): its band when a model is busy, and its share of it.
    priority: str = "normal"
    share: float = 1.0

    def expired(self, today: dt.date | None = None) -> bool:
        # A key is good through the day it names: "expires: 2026-12-31" still works that day.
        return self.expires is not None and (today or dt.date.today()) > self.expires

    def may_use(self, names: Iterable[str]) -> bool:
        """Whether any of a model's names (its name and aliases) is one this key lists."""
        if self.models is None:
            return True
        return any(fnmatch.fnmatchcase(n, p) for n in names for p in self.models)


# The plain digest file's keys have no name of their own: metrics show them all as one.
ANONYMOUS = Tenant("anonymous")


def read_digest_file(path: Path) -> dict[str, Tenant]:
    """LLMGW_API_KEYS_FILE: SHA-256 hex digests, one a line; blank lines and # comments skipped."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UsageError(
            f"cannot read LLMGW_API_KEYS_FILE {path}: {exc.strerror or exc}. "
            "Point it at a file of SHA-256 digests of the keys, one a line."
        ) from None
    lines = _utf8(raw, path, "LLMGW_API_KEYS_FILE").splitlines()
    digests = {}
    for number, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip().lower()
        if not line:
            continue
        if not _HEX64.match(line):
            raise UsageError(
                f"{path}:{number} (LLMGW_API_KEYS_FILE) is not a SHA-256 hex digest. Store "
                "`sha256(key)` in hex (e.g. `printf %s KEY | sha256sum`), never the key itself."
            )
        digests[line] = ANONYMOUS
    return digests


def read_keys_file(path: Path) -> dict[str, Tenant]:
    """LLMGW_KEYS_FILE (keys.yaml): digest → tenant; UsageError saying what to fix."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UsageError(
            f"cannot read LLMGW_KEYS_FILE {path}: {exc.strerror or exc}. Point it at the "
            "keys.yaml kept in git beside the catalogue."
        ) from None
    doc = _yaml(_utf8(raw, path, "LLMGW_KEYS_FILE"), path)
    _check_schema(doc, path)
    entries = doc["keys"]
    tenants: dict[str, Tenant] = {}
    names: set[str] = set()
    for number, entry in enumerate(entries, 1):
        tenant, digest = _entry(path, number, entry)
        if digest in tenants or tenant.name in names:
            raise UsageError(
                f"{path} (LLMGW_KEYS_FILE): key #{number} ('{tenant.name}') repeats the name or "
                "hash of an earlier key; each key needs its own, so usage is told apart."
            )
        tenants[digest] = tenant
        names.add(tenant.name)
    return tenants


def _utf8(raw: bytes, path: Path, setting: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A Latin-1 `é` in a comment once escaped as a traceback, and the worker that
        # started next exited, taking the whole gateway with it.
        raise UsageError(
            f"{path} ({setting}) is not UTF-8: byte {exc.start} is {raw[exc.start]:#04x}. "
            "Save the file as UTF-8."
        ) from None


def _yaml(text: str, path: Path) -> Any:
    """keys.yaml's data, read with lint's bounded loader; UsageError with lint's own sentence
    for anything YAML or Python cannot make of it, or that would expand past reason."""
    if len(text) > MAX_FILE_BYTES:
        raise UsageError(
            f"{path} (LLMGW_KEYS_FILE) is {len(text):,} characters, more than the "
            f"{MAX_FILE_BYTES:,} llmgw reads; a key's entry is a line or two."
        )
    # lint's sentence, not the parser's states: the person reading /readyz fixes the file from it.
    return parsed_or_refused(text, str(path), "LLMGW_KEYS_FILE")


def _check_schema(doc: Any, path: Path) -> None:
    where = first_error_path("keys", dates_as_text(doc))
    if where is None:
        return
    if len(where) < 2 or where[0] != "keys" or not isinstance(where[1], int):
        raise UsageError(
            f"{path} (LLMGW_KEYS_FILE) must be `keys:` and a list of keys, each `- name: ...` with "
            "`sha256: ...` (`keys: []` for none). `llmgw lint --keys FILE` says where."
        )
    number, entry = where[1] + 1, doc["keys"][where[1]]
    name = entry.get("name") if isinstance(entry, dict) else None
    label = f"key #{number}" + (f" ('{name.strip()}')" if isinstance(name, str) else "")
    field = str(where[2]) if len(where) > 2 else None
    if field in _FIELD_SENTENCES:
        what = _FIELD_SENTENCES[field]
    elif not isinstance(entry, dict):
        what = "it is not a mapping; write `- name: ...` with `sha256: ...`"
    else:
        fields = ", ".join(sorted(_FIELD_SENTENCES))
        what = f"a key takes {fields}, and needs name and sha256"
    raise UsageError(f"{path} (LLMGW_KEYS_FILE), {label}: {what}. `llmgw lint --keys FILE` says where.")


def _entry(path: Path, number: int, entry: dict[str, Any]) -> tuple[Tenant, str]:
    """One entry the schema passed, as the tenant it names and its key's digest."""
    expires = entry.get("expires")
    if isinstance(expires, dt.datetime):
        expires = expires.date()
    elif isinstance(expires, str):  # quoted, so YAML left it text: the schema checks no format
        try:
            expires = dt.date.fromisoformat(expires)
        except ValueError:
            raise UsageError(
                f"{path} (LLMGW_KEYS_FILE), key #{number} ('{entry['name']}'): "
                f"{_FIELD_SENTENCES['expires']}, not {expires!r}."
            ) from None
    models = entry.get("models")
    rpm, tpm = entry.get("rpm"), entry.get("tpm")
    spec = entry.get("budget")
    budget = Budget(spec["tokens"], spec["every"], spec.get("warn_at")) if spec is not None else None
    tenant = Tenant(
        entry["name"],
        None if models is None else tuple(models),
        rpm,
        tpm,
        expires,
        budget,
        priority=entry.get("priority", "normal"),
        share=float(entry.get("share", 1)),
    )
    return tenant, entry["sha256"].lower()


class Keys:
    """The keys this worker accepts now; `check_file` picks up a replaced file."""

    def __init__(self, path: Path, structured: bool) -> None:
        self.path = path
        self.last_good = path.with_name(f".{path.name}.last-good")
        self.read = read_keys_file if structured else read_digest_file
        self._signature = file_signature(path)
        self.refusal: str | None = None
        try:
            self.tenants = self._read_file()
        except UsageError as exc:
            # With no keys read well before, a bad file stops the gateway, as a bad plan does.
            if not self.last_good.is_file():
                raise
            self.tenants = self.read(self.last_good)
            self.refusal = _refusal(exc)
            log.error("refused the keys file at start: %s", self.refusal)
            return
        self._keep_as_last_good()

    def check_file(self) -> None:
        signature = file_signature(self.path)
        if signature == self._signature:
            return
        self._signature = signature
        try:
            tenants = self._read_file()
        except UsageError as exc:
            self.refusal = _refusal(exc)
            log.error("refused the keys file: %s", self.refusal)
            return
        self.tenants = tenants
        self.refusal = None
        self._keep_as_last_good()
        log.info("keys reloaded from %s: %d key(s)", self.path, len(self.tenants))

    def _read_file(self) -> dict[str, Tenant]:
        """The keys file's tenants; UsageError for whatever keeps it from being served.

        The readers turn every mistake they know into a sentence; anything else is a bug,
        but still a refusal: escaping, it left /readyz saying `loaded` in running workers
        and stopped the next one from starting.
        """
        try:
            return self.read(self.path)
        except UsageError:
            raise
        except Exception as exc:
            log.exception("reading the keys file %s failed", self.path)
            raise UsageError(
                f"the gateway failed reading {self.path} ({type(exc).__name__}); its log has "
                "the details. `llmgw lint --keys` checks the file."
            ) from None

    def _keep_as_last_good(self) -> None:
        try:
            text = self.path.read_bytes()
            if file_signature(self.path) != self._signature:
                return  # replaced since it was read: whoever reads the new one keeps that
            replace_file(self.last_good, text, owned=True)
        except OSError as exc:
            log.warning(
                "cannot keep a copy of the keys at %s (%s): a worker started while the keys file "
                "is bad will not start",
                self.last_good,
                exc.strerror or exc,
            )

    async def watch(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                self.check_file()
            except Exception:  # one bad poll must not end reloading for good
                log.exception("checking %s for new keys failed", self.path)


def _refusal(exc: UsageError) -> str:
    # The same words in a worker that refused the file while running and in one that
    # started on it, so every worker's /readyz and dashboard say the same.
    return f"{exc} Still accepting the keys read before."


def keys_from_settings(keys_file: Path | None, api_keys_file: Path | None) -> Keys | None:
    """The keys the gateway checks; None when it takes requests without a key."""
    if keys_file is not None and api_keys_file is not None:
        raise UsageError(
            "LLMGW_KEYS_FILE and LLMGW_API_KEYS_FILE are both set; set one. Move the plain "
            "file's digests into keys.yaml, each under a name, to use both kinds of key."
        )
    if keys_file is not None:
        return Keys(keys_file, structured=True)
    if api_keys_file is not None:
        return Keys(api_keys_file, structured=False)
    return None
