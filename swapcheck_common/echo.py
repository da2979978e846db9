"""What an error message may echo of a user's value: a bounded excerpt, never a secret.

Every spec and pre-registration problem (``swapcheck_common.toml_model``, ``orchestrator.errors.SpecError``)
goes through here, so that

- a value is shown as at most about :data:`MAX_ECHO` characters (``[64, 64, ...… (300000 values)]``);
- a value that looks like an environment reference (``${NAME}``, ``$NAME``) or a credential (an AWS key
  id, a private key, a token with a known prefix, a long mixed-case random string) is never shown,
  nor any value of a field named like a secret (``password``, ``token``, ``secret_key``, ...): the
  message says what was wrong and that the value is not shown;
- a problem line is at most :data:`MAX_LINE` characters.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["MAX_ECHO", "MAX_LINE", "echo", "looks_secret", "scrub", "secret_field"]

#: Most characters of a value an error message shows.
MAX_ECHO = 200
#: Most characters of one problem line.
MAX_LINE = 1200

_ENV_REF = re.compile(r"\$\{[^}]*\}?|\$[A-Za-z_][A-Za-z0-9_]*")
_CREDENTIAL = re.compile(
    r"(?:A3T[A-Z0-9]|AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}"  # AWS access key ids
    r"|-----BEGIN [A-Z ]*PRIVATE KEY"
    r"|\b(?:ghp|gho|ghu|ghs|ghr|github_pat|glpat|xox[abposr]|sk|sk_live|pk_live|hf)[_-][A-Za-z0-9_-]{16,}"
    r"|\bAIza[0-9A-Za-z_-]{30,}"
    r"|\beyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"  # a JWT
    r"|://[^/\s:@'\"]+:[^/\s@'\"]+@"  # credentials inside a URL
)
# A long run of base64 characters with upper case, lower case, digits and high entropy: a random
# secret (an AWS secret key, a bearer token), not a word, a path or a hex digest.
_RANDOM = re.compile(r"[A-Za-z0-9+/=]{32,}")
_SECRET_NAME = re.compile(r"(?i)secret|passw|passphrase|token|credential|api[_-]?key|access[_-]?key|"
                          r"private[_-]?key|auth(?!or)|cookie|session[_-]?id|signature")
_QUOTED = re.compile(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"")

HIDDEN_ENV = "<not shown: it holds an environment reference>"
HIDDEN_SECRET = "<not shown: it looks like a secret>"
HIDDEN_FIELD = "<not shown: the field is named like a secret>"


def _entropy(text: str) -> float:
    import math
    from collections import Counter

    return -sum(c / len(text) * math.log2(c / len(text)) for c in Counter(text).values())


def _random_looking(text: str) -> bool:
    return any(re.search(r"[A-Z]", m) and re.search(r"[a-z]", m) and re.search(r"[0-9]", m)
               and _entropy(m) >= 4.5 for m in _RANDOM.findall(text))


def looks_secret(text: str) -> str | None:
    """Why ``text`` must not be echoed (:data:`HIDDEN_ENV`, :data:`HIDDEN_SECRET`), or None."""
    if _ENV_REF.search(text):
        return HIDDEN_ENV
    if _CREDENTIAL.search(text) or _random_looking(text):
        return HIDDEN_SECRET
    return None


def secret_field(where: Any) -> bool:
    """Whether a field path (``experiments.x.params.api_key`` or its parts) names a secret."""
    parts = where if isinstance(where, (tuple, list)) else (where,)
    return any(isinstance(p, str) and _SECRET_NAME.search(p) for p in parts)


def _strings(value: Any, limit: int = 10_000) -> list[str]:
    """The strings inside ``value`` (keys included), at most ``limit`` of them, without recursion."""
    out: list[str] = []
    stack = [value]
    while stack and len(out) < limit:
        v = stack.pop()
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple, set, frozenset)):
            stack.extend(v)
    return out


def _bounded_repr(value: Any, budget: int) -> str:
    """``repr(value)`` cut at about ``budget`` characters, saying how much was left out."""
    if isinstance(value, str):
        if len(value) <= budget:
            return repr(value)
        return repr(value[:budget]) + f"… ({len(value)} characters)"
    if isinstance(value, (list, tuple)):
        open_, close = ("[", "]") if isinstance(value, list) else ("(", ")")
        parts: list[str] = []
        used = 0
        for item in value:
            text = _bounded_repr(item, max(budget - used, 20))
            if used + len(text) > budget and parts:
                return open_ + ", ".join(parts) + f", … ({len(value)} values){close}"
            parts.append(text)
            used += len(text) + 2
            if used > budget:
                break
        if len(parts) < len(value):
            return open_ + ", ".join(parts) + f", … ({len(value)} values){close}"
        return open_ + ", ".join(parts) + close
    if isinstance(value, dict):
        items: list[str] = []
        used = 0
        for k, v in value.items():
            text = f"{_bounded_repr(k, 60)}: {_bounded_repr(v, max(budget - used, 20))}"
            if used + len(text) > budget and items:
                return "{" + ", ".join(items) + f", … ({len(value)} keys)}}"
            items.append(text)
            used += len(text) + 2
        return "{" + ", ".join(items) + "}"
    text = repr(value)
    return text if len(text) <= budget else text[:budget] + f"… ({len(text)} characters)"


def echo(value: Any, where: Any = ()) -> str:
    """How an error message shows ``value`` of the field at ``where``: a bounded ``repr``, or why not."""
    if secret_field(where):
        return HIDDEN_FIELD
    for s in _strings(value):
        why = looks_secret(s)
        if why:
            return why
    return _bounded_repr(value, MAX_ECHO)


def scrub(line: str) -> str:
    """A problem line with every quoted value that looks like a secret replaced, and its length bounded.

    The last line of defence for messages built elsewhere (``unknown kernel '${X}'``): quoted spans
    holding an environment reference or a credential are replaced whole, any such token left outside
    quotes too, and the line is cut at :data:`MAX_LINE` characters."""

    def quoted(m: re.Match[str]) -> str:
        why = looks_secret(m.group(0)[1:-1])
        if why:
            return why
        if len(m.group(0)) > MAX_ECHO + 2:
            return _bounded_repr(m.group(0)[1:-1], MAX_ECHO)
        return m.group(0)

    out = _QUOTED.sub(quoted, line)
    out = _ENV_REF.sub(HIDDEN_ENV, out)
    out = _CREDENTIAL.sub(HIDDEN_SECRET, out)
    out = _RANDOM.sub(lambda m: HIDDEN_SECRET if _random_looking(m.group(0)) else m.group(0), out)
    if len(out) > MAX_LINE:
        out = out[:MAX_LINE] + f"… ({len(out)} characters)"
    return out
