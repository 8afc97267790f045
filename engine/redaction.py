"""Keeping secrets out of everything the engine writes down: errors, histories, traces and logs.

A workflow history is forever and readable by anyone with access to the namespace, so no error
that reaches it may quote a password or a key. Call sites redact what they know (a database URL,
an agent's base URL), and one last pass catches what they do not: `redact_text` runs over every
failure the data converter writes (engine/storage/payloads.py) and every log line
(runtime/logging.py). It removes

- the password of any URL's user part, and a user part that is itself a key;
- query parameters whose names say they are secret (`?password=`, `?sig=`, `?api_key=`, ...);
- `password=...` in libpq's key=value form;
- credentials in HTTP auth headers of every scheme (`Authorization: Basic ...`, `Token ...`,
  `Proxy-Authorization`), in headers whose names say they are secret (`x-api-key: ...`), and a
  `Bearer ...` or `Basic ...` credential wherever it stands (Basic only when it decodes to
  `user:password`, so "basic arithmetic" stays);
- the values of key-like fields in JSON or a Python repr (`"api_key": "..."`,
  `'Authorization': '...'`): the field name says it is secret, whatever the value looks like;
- strings shaped like the API keys of the providers people use (`sk-...`, `AIza...`, `hf_...`);
- the exact values of environment variables whose names say they hold secrets, and each entry
  of such a value that is a comma-separated list (`CONDUCTOR_API_KEYS=key1,key2`).
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from urllib.parse import parse_qsl, urlsplit, urlunsplit

MASK = "***"

_SECRET_NAME = re.compile(
    r"(?i)^(?:.*(?:password|passwd|passphrase|secret|token|signature|credentials?|apikey|api[_-]key)"
    r"|(?:.*[_-])?(?:key|pass|pwd|sig|auth|authorization|session))$")
"""A query parameter or variable name that holds a secret (`sslpassword`, `x-amz-signature`,
`access_token`, `api_key`, ...), matched on its last word."""

_SECRET_ENV = re.compile(r"(?i)(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH)")

# Keys of the providers people use, by their documented shapes: OpenAI and Anthropic (sk-...),
# Google (AIza...), Hugging Face (hf_...), Groq (gsk_...), xAI (xai-...), GitHub (ghp_...,
# github_pat_...), AWS access key ids (AKIA/ASIA...), Slack (xox?-...), GitLab (glpat-...),
# Replicate (r8_...), NVIDIA (nvapi-...), Perplexity (pplx-...), Tavily (tvly-...).
_KEY_SHAPES = re.compile(
    r"\b(?:sk-[A-Za-z0-9_\-]{16,}|AIza[0-9A-Za-z_\-]{30,}|hf_[A-Za-z0-9]{20,}|gsk_[A-Za-z0-9]{20,}"
    r"|xai-[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9\-]{10,}|glpat-[A-Za-z0-9_\-]{20,}"
    r"|r8_[A-Za-z0-9]{20,}|nvapi-[A-Za-z0-9_\-]{20,}|pplx-[A-Za-z0-9]{20,}"
    r"|tvly-[A-Za-z0-9\-]{20,})")
_BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=\-]{8,}")
_BASIC = re.compile(r"(?i)\b(basic\s+)([A-Za-z0-9+/]{4,}={0,2})(?![A-Za-z0-9+/=])")
# An auth header: its scheme word (Basic, Token, Digest, ...) kept, the rest of the line masked.
_AUTH_HEADER = re.compile(r"(?im)(?<![\w-])((?:proxy-)?authorization[ \t]*[:=][ \t]*)"
                          r"(?:([A-Za-z][\w-]*)[ \t]+(?=\S))?([^\r\n]+)")
# Any other `Name: value` header; masked when _SECRET_NAME says the name is secret.
_HEADER = re.compile(r"(?m)(?<![\w-])([A-Za-z][\w-]*)([ \t]*:[ \t]*)([^\s'\",;]+)")
# A quoted field and its quoted value: JSON's "name": "value" or a repr's 'name': 'value'.
_FIELD = re.compile(r"""(?P<q>["'])(?P<name>[A-Za-z][\w-]*)(?P=q)(\s*:\s*)"""
                    r"""(?P<v>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')""")
_DSN_PASSWORD = re.compile(r"(?i)\b((?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&;,]+)")
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>`]+")


def looks_like_key(text: str) -> bool:
    """Whether `text` has the shape of a provider's API key (used to refuse a key where a
    variable's name belongs)."""
    return _KEY_SHAPES.search(text) is not None


def redact_url(url: str) -> str:
    """The URL without its secrets: the password of its user part (and a user part that is a
    key), and every query parameter whose name says it is secret. libpq's `key=value` form gets
    its `password=` masked."""
    if "://" not in url:
        return _DSN_PASSWORD.sub(rf"\1{MASK}", url)
    try:
        parts = urlsplit(url)
        password, user = parts.password, parts.username
    except ValueError:  # not a URL after all (a bad port, brackets): mask what looks secret
        return _KEY_SHAPES.sub(MASK, _DSN_PASSWORD.sub(rf"\1{MASK}", url))
    netloc = parts.netloc
    if "@" in netloc:
        hostport = netloc.rpartition("@")[2]
        if user and looks_like_key(user) or user and password is None and len(user) >= 20:
            user = MASK  # `https://TOKEN@host`: the user part is the credential
        shown = (user or "") + (f":{MASK}" if password is not None else "")
        netloc = f"{shown}@{hostport}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_SECRET_NAME.match(k) for k, _ in pairs):
            query = "&".join(f"{k}={MASK}" if _SECRET_NAME.match(k) else
                             (f"{k}={v}" if v else k) for k, v in pairs)
    return urlunsplit(parts._replace(netloc=netloc, query=query))


@lru_cache(maxsize=64)
def _environment_secrets(items: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    values = {v for k, v in items if _SECRET_ENV.search(k) and len(v) >= 8}
    for v in list(values):  # a list of keys (CONDUCTOR_API_KEYS=a,b): each entry on its own
        values.update(part.strip() for part in v.split(",") if len(part.strip()) >= 8)
    for k, v in items:  # the passwords inside configured URLs
        if k.endswith("_URL") and "://" in v:
            try:
                password = urlsplit(v).password
            except ValueError:
                continue
            if password and len(password) >= 4:
                values.add(password)
    return tuple(sorted(values, key=len, reverse=True))


def environment_secrets(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The values of the environment variables whose names say they hold secrets (API keys,
    tokens, passwords) and the passwords of URLs in `*_URL` variables, longest first."""
    env = os.environ if environ is None else environ
    return _environment_secrets(tuple(sorted(env.items())))


def _basic(match: re.Match[str]) -> str:
    """A `Basic` credential masked when it is one: base64 of `user:password`."""
    try:
        decoded = base64.b64decode(match.group(2), validate=True)
    except (binascii.Error, ValueError):
        return match.group(0)
    return f"{match.group(1)}{MASK}" if b":" in decoded else match.group(0)


def _auth_header(match: re.Match[str]) -> str:
    name, scheme, _ = match.groups()
    return f"{name}{scheme + ' ' if scheme else ''}{MASK}"


def _header(match: re.Match[str]) -> str:
    """`Name: value` with the value masked when the name says it is secret."""
    name, colon, _ = match.groups()
    if name.lower() in ("authorization", "proxy-authorization"):  # done by _auth_header
        return match.group(0)
    return f"{name}{colon}{MASK}" if _SECRET_NAME.match(name) else match.group(0)


def _field(match: re.Match[str]) -> str:
    """A quoted field whose name says it is secret, with its quoted value masked."""
    if not _SECRET_NAME.match(match.group("name")):
        return match.group(0)
    quote = match.group("v")[0]
    return f"{match.group(0)[:match.start('v') - match.start()]}{quote}{MASK}{quote}"


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every secret this module can recognise masked: the given `secrets` and the
    environment's (exact values, and each entry of a comma-separated one), URLs' passwords and
    secret parameters, DSN passwords, auth headers of any scheme and secret-named headers,
    key-like JSON fields, bearer and basic credentials, and key-shaped strings."""
    for value in (*secrets, *environment_secrets()):
        if value and value in text:
            text = text.replace(value, MASK)
    text = _URL.sub(lambda m: redact_url(m.group(0)), text)
    text = _DSN_PASSWORD.sub(rf"\1{MASK}", text)
    text = _FIELD.sub(_field, text)
    text = _AUTH_HEADER.sub(_auth_header, text)
    text = _HEADER.sub(_header, text)
    text = _BEARER.sub(rf"\1{MASK}", text)
    text = _BASIC.sub(_basic, text)
    return _KEY_SHAPES.sub(MASK, text)
