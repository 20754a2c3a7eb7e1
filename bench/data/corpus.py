"""The embedded translation corpus (``en`` words -> ``sym`` symbols): numbers, dates and small
events, generated deterministically with disjoint splits (docs/internals/data.md)."""

from __future__ import annotations

import random
from pathlib import Path

from filelock import FileLock

VERSION = 1  # bump when the generator changes (cached corpora are keyed by it)
SRC, TGT = "en", "sym"


def _pairs(keys: str, values: str) -> dict[str, str]:
    return dict(zip(keys.split(), values.split(), strict=True))


_ONES = "zero one two three four five six seven eight nine".split()
_TEENS = "ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_ORD = _pairs(
    "one two three five eight nine twelve", "first second third fifth eighth ninth twelfth"
)
_MONTHS = (
    "january february march april may june july august september october november december"
).split()
_OPS = {"plus": "+", "minus": "-", "times": "*"}
_NAMES = "alice bob carol dave erin frank grace heidi ivan judy".split()
_ITEMS = _pairs(
    "apples books cats cups hats keys pens shoes",
    "pommes livres chats tasses chapeaux cles stylos souliers",
)
_COLOURS = _pairs("red blue green black white small", "rouges bleus verts noirs blancs petits")


def words(n: int) -> str:
    """0 <= n <= 9999 in English words (``three hundred forty two``)."""
    if n < 10:
        return _ONES[n]
    if n < 20:
        return _TEENS[n - 10]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    if n < 1000:
        rest = "" if n % 100 == 0 else " " + words(n % 100)
        return f"{_ONES[n // 100]} hundred{rest}"
    rest = "" if n % 1000 == 0 else " " + words(n % 1000)
    return f"{words(n // 1000)} thousand{rest}"


def ordinal(n: int) -> str:
    """1 <= n <= 31 as an English ordinal (``twenty first``)."""
    *head, last = words(n).split()
    if last in _ORD:
        last = _ORD[last]
    else:
        last = last[:-1] + "ieth" if last.endswith("y") else last + "th"
    return " ".join([*head, last])


def year_words(y: int) -> str:
    """A year the way it is said: ``nineteen ninety nine``, ``two thousand seven``."""
    if 2000 <= y < 2010:
        return words(y)
    hi, lo = divmod(y, 100)
    return f"{words(hi)} {'hundred' if lo == 0 else words(lo)}"


def _arith(r: random.Random) -> tuple[str, str]:
    a, b = r.randrange(1000), r.randrange(1000)
    op = r.choice(sorted(_OPS))
    return f"{words(a)} {op} {words(b)}", f"{_OPS[op]} {a} {b}"


def _date(r: random.Random) -> tuple[str, str]:
    y, m, d = r.randrange(1900, 2100), r.randrange(12), r.randrange(1, 29)
    return f"{_MONTHS[m]} {ordinal(d)} {year_words(y)}", f"{y} . {m + 1:02d} . {d:02d}"


def _event(r: random.Random) -> tuple[str, str]:
    giver, taker = r.sample(_NAMES, 2)
    item, colour = r.choice(sorted(_ITEMS)), r.choice(sorted(_COLOURS))
    n = r.randrange(2, 100)
    return (
        f"{giver} gives {words(n)} {colour} {item} to {taker}",
        f"{taker} recoit {n} {_ITEMS[item]} {_COLOURS[colour]} de {giver}",
    )


_KINDS = (_arith, _date, _event)


def sentence_pairs(n: int, seed: int, exclude: set[str] | frozenset[str] = frozenset()):
    """``n`` distinct (source, target) pairs whose source is not in ``exclude``."""
    r = random.Random(seed)
    seen, out = set(exclude), []
    while len(out) < n:
        src, tgt = _KINDS[r.randrange(len(_KINDS))](r)
        if src not in seen:
            seen.add(src)
            out.append((src, tgt))
    return out


def write_corpus(
    root: str | Path, train: int = 20000, valid: int = 500, test: int = 500, seed: int = 0
) -> Path:
    """Write ``{train,valid,test}.{en,sym}`` under ``root`` unless all are there."""
    root = Path(root)
    names = [f"{s}.{lang}" for s in ("train", "valid", "test") for lang in (SRC, TGT)]
    if all((root / f).is_file() for f in names):
        return root
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / ".corpus.lock")):  # workers of one run may start together
        if all((root / f).is_file() for f in names):
            return root
        held = sentence_pairs(valid + test, seed + 1)
        splits = {
            "valid": held[:valid],
            "test": held[valid:],
            "train": sentence_pairs(train, seed, exclude={s for s, _ in held}),
        }
        for split, pairs in splits.items():
            for lang, i in ((SRC, 0), (TGT, 1)):
                tmp = root / f".{split}.{lang}.tmp"
                tmp.write_text("".join(p[i] + "\n" for p in pairs))
                tmp.replace(root / f"{split}.{lang}")
    return root


def embedded_root(base: str, train: int, seed: int) -> Path:
    """Where the embedded corpus of these settings lives under the data cache ``base``."""
    return Path(base) / f"translation-embedded-v{VERSION}-n{train}-s{seed}"
