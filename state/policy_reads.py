"""Whether a stored policy text reads an attribute name, as written or spelt with Cedar's string escapes."""

from __future__ import annotations

import functools
import re

_WORD = re.compile(r"\w+")


def read_by_policy(name: str, texts: tuple[str, ...]) -> bool:
    """Whether the name appears in a policy text (or in it with escapes resolved) with no word character beside it."""
    if _WORD.fullmatch(name):  # such an occurrence is a whole run of word characters: look it up
        return name in _spelt_words(texts)
    # Not \b: a name that starts or ends with a non-word character ("level!") has no word boundary there.
    pattern = re.compile(rf"(?<!\w){re.escape(name)}(?!\w)")
    return any(pattern.search(spelt) for text in texts for spelt in (text, _unescaped(text)))


@functools.lru_cache(maxsize=2)  # the stored policies and the set before a bundle changed them: texts can be large
def _spelt_words(texts: tuple[str, ...]) -> frozenset[str]:
    """Every run of word characters in these policy texts, as written and with escapes resolved: found once per
    set of stored policies. Searched for at each principal upsert, they cost a third of applying one (8,000 of
    them, in process: 0.26 of 0.73 s)."""
    return frozenset(word for text in texts for spelt in (text, _unescaped(text)) for word in _WORD.findall(spelt))


@functools.lru_cache(maxsize=1024)  # the stored texts change rarely; principal updates come often
def _unescaped(text: str) -> str:
    """The text with Cedar's string escapes resolved: `principal["\\u{61}ge"]` reads `age`."""
    def one(m: re.Match) -> str:
        code = m.group(1)
        if code.startswith("u{"):
            try:
                return chr(int(code[2:-1], 16))
            except ValueError:
                return m.group(0)
        return _ESCAPED.get(code, code)
    return _ESCAPE.sub(one, text)


_ESCAPE = re.compile(r"\\(u\{[0-9a-fA-F]{1,6}\}|.)", re.DOTALL)
_ESCAPED = {"n": "\n", "r": "\r", "t": "\t", "0": "\0"}
