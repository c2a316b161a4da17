"""DOT's tokens: quoted strings (``quote``) and the id of every box (``_Ids``).

Everything ``to_dot`` writes as text between quotes goes through ``quote``, which makes it a
string Graphviz reads as text only, whatever the graph holds; ``_Ids`` gives every node and
saved-tensor box an id of its own, the node's own id when DOT reads it as one token.
"""

from __future__ import annotations

import re

from ..graph.graph import Node
from ..output.style import UNSAFE_CHARS, clean_text

#: The longest string written in DOT, in characters: Graphviz's reader stops at 16,384 bytes, and
#: a character takes at most 4 (a backslash 2, escaped).
MAX_QUOTED = 3800


def quote(s: str) -> str:
    """A DOT double-quoted string that Graphviz reads as text only: ``\\`` and ``"`` escaped
    (so no ``\\N``-style label escape and no end of the string), a newline written as DOT's
    line break, and control characters, bidirectional marks and lone surrogates as visible
    escapes (``clean_text``): Graphviz stops at NUL, and a surrogate cannot be written as
    UTF-8."""
    if len(s) > MAX_QUOTED or _QUOTE_WORK.search(s):  # else (the common case) as it is
        s = clean_text(s, newlines=True)
        if len(s) > MAX_QUOTED:  # Graphviz refuses a string longer than 16 KiB: keep the start
            s = s[:MAX_QUOTED] + f"… ({len(s) - MAX_QUOTED} more characters)"
        s = s.replace("\\", "\\\\").replace('"', '\\"')
    if "\n" in s:
        s = s.replace("\n", "\\n")
    return '"' + s + '"'


#: What ``quote`` has to change besides newlines: ``\\``, ``"`` and the unsafe characters of
#: ``clean_text`` (``UNSAFE_CHARS`` less the newline).
_QUOTE_WORK = re.compile(
    '[\\\\"' + UNSAFE_CHARS.pattern[1:].replace("\x00-\x1f", "\x00-\x09\x0b-\x1f")
)


class _Quoted(dict[str, str]):
    """``quote`` of each distinct string of one render, computed on first use: a deep model
    repeats the same few labels and colours thousands of times (``cache[s] == quote(s)``)."""

    __slots__ = ()

    def __missing__(self, s: str) -> str:
        q = self[s] = quote(s)
        return q


class _Plain(dict[str, bool]):
    """Whether ``quote`` would only add the quotes around a string (``plain[s]``), checked
    once per distinct string: a text made of plain pieces, no longer than ``MAX_QUOTED`` in
    all, is then quoted by joining them. Only ``str`` itself is checked (anything else: False)."""

    __slots__ = ()

    def __missing__(self, s: str) -> bool:
        ok = self[s] = (type(s) is str and len(s) <= MAX_QUOTED and "\n" not in s
                        and not _QUOTE_WORK.search(s))
        return ok


#: An id DOT reads as one token without quotes; DOT's keywords (any case) are not.
_BARE_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_BARE_IDS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:,[A-Za-z_][A-Za-z0-9_]*)*")
_DOT_KEYWORDS = frozenset({"node", "edge", "graph", "digraph", "subgraph", "strict"})


def _keyword_in(low: str) -> bool:
    """Whether a DOT keyword is one whole id of ``low``: bare ids, lowered, joined by commas
    with a comma at each end."""
    return any("," + k + "," in low for k in _DOT_KEYWORDS)


class _Ids:
    """The DOT id of every node and saved-tensor box: the node's own id when DOT reads it as
    one token (``n0``: what every captured graph has), else that id quoted, its unsafe
    characters made visible; one that would name an id already taken (two ids alike once
    cleaned, or a node called ``n0_s0`` beside the saved box of ``n0``) gets a ``~k`` suffix,
    so every node is its own box whatever the ids say."""

    def __init__(self, nodes: list[Node]) -> None:
        ids = [n.id for n in nodes]
        joined = ",".join(ids)
        # a keyword (any case) as a whole id: one substring search per keyword of the
        # lowered list (a regex alternation at every position cost 2 ms on 7,000 ids)
        if _BARE_IDS.fullmatch(joined) and not _keyword_in("," + joined.lower() + ","):
            used = set(ids)
            if len(used) == len(ids):  # every captured graph: n0, n1... each its own token
                self.used = used
                self.tok = dict(zip(ids, ids, strict=True))
                return
        self.used = set()
        self.tok = {}
        for nid in ids:
            if nid not in self.tok:
                self.tok[nid] = self.new(nid)

    def saved(self, nid: str, i: int) -> str:
        """The id of the ``i``-th saved-tensor box of node ``nid``."""
        want = f"{nid}_s{i}"
        if self.tok.get(nid) == nid and want not in self.used:  # bare: so is want
            self.used.add(want)
            return want
        return self.new(want)

    def new(self, want: str) -> str:
        if _BARE_ID.match(want) and want not in self.used and want.lower() not in _DOT_KEYWORDS:
            self.used.add(want)  # the common case: n0, n0_s1
            return want
        text = clean_text(want)
        key, k = text, 1
        while key in self.used:
            key = f"{text}~{k}"
            k += 1
        self.used.add(key)
        return key if _BARE_ID.match(key) and key.lower() not in _DOT_KEYWORDS else quote(key)

    def of(self, nid: str) -> str:
        tok = self.tok.get(nid)
        if tok is None:  # an edge to a node the graph does not hold
            tok = self.tok[nid] = self.new(nid)
        return tok
