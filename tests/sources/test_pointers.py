"""The pointer grammar as a table, plus properties that must hold for every string."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.pointers import (
    MAX_SEQUENCE,
    ArtifactPointer,
    BadPointer,
    TranscriptPointer,
    format_pointer,
    is_valid_component,
    is_valid_digest,
    is_valid_session_id,
    parse_pointer,
)

H64 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
H12 = H64[:12]
LONG = "a" * 200

VALID = [
    ("transcript:s1:1", TranscriptPointer("s1", 1)),
    ("transcript:S-1_a.b:42", TranscriptPointer("S-1_a.b", 42)),
    ("transcript:0:7", TranscriptPointer("0", 7)),
    (f"transcript:{LONG}:999999999999999999", TranscriptPointer(LONG, MAX_SEQUENCE)),
    ("transcript:3af9b1a7-6512-4883-ad18-320658ced099:216", None),
    (f"artifact:s1:a.txt:{H64}", ArtifactPointer("s1", "a.txt", H64)),
    (f"artifact:s1:a.txt:{H12}", ArtifactPointer("s1", "a.txt", H12)),
    (f"artifact:{LONG}:{LONG}:{H64}", ArtifactPointer(LONG, LONG, H64)),
    (f"artifact:s1:a..b:{H12}", ArtifactPointer("s1", "a..b", H12)),
    (f"artifact:s1:toolu_01ABC.json:{H12}", None),
    (f"artifact:s1:console.log:{H12}", None),  # not a device name: the stem is "console"
]

CORRUPT = [
    # not text at all
    None,
    1,
    b"transcript:s1:1",
    ["transcript:s1:1"],
    # sequence
    "transcript:s1:0",
    "transcript:s1:01",
    "transcript:s1:+1",
    "transcript:s1:-1",
    "transcript:s1: 1",
    "transcript:s1:1 ",
    "transcript:s1:1_000",
    "transcript:s1:1e3",
    "transcript:s1:0x1",
    "transcript:s1:1.0",
    "transcript:s1:",
    "transcript:s1",
    "transcript:s1:1000000000000000000",  # 19 digits
    "transcript:s1:99999999999999999999999999",
    "transcript:s1:\u0661\u0662",  # ARABIC-INDIC DIGITS ONE TWO: str.isdigit() is True
    "transcript:s1:\uff11",  # FULLWIDTH DIGIT ONE
    "transcript:s1:\u00b2",  # SUPERSCRIPT TWO: isdigit() True, int() raises
    "transcript:s1:\u0967",  # DEVANAGARI DIGIT ONE
    "transcript:s1:1\n",
    "transcript:s1:1\r\n",
    "transcript:s1:1\x00",
    "transcript:s1:1:extra",
    # components
    "transcript::1",
    "transcript:.:1",
    "transcript:..:1",
    "transcript:.hidden:1",
    "transcript:-rf:1",
    "transcript:_x:1",
    "transcript:s 1:1",
    "transcript:s\t1:1",
    "transcript:s1\x00:1",
    "transcript:s\u00e91:1",
    "transcript:s/1:1",
    "transcript:s\\1:1",
    "transcript:%2e%2e:1",
    "transcript:CON:1",
    "transcript:nul.txt:1",
    "transcript:Lpt1.log:1",
    "transcript:s1.:1",
    f"transcript:{LONG}a:1",  # 201 characters
    f"artifact::a.txt:{H64}",
    f"artifact:s1::{H64}",
    f"artifact:s1:.:{H64}",
    f"artifact:s1:..:{H64}",
    f"artifact:s1:../x:{H64}",
    f"artifact:s1:a:b.txt:{H64}",
    f"artifact:s1:a.txt:{H64}:x",
    f"artifact:s1:{LONG}a:{H64}",
    # digests
    f"artifact:s1:a.txt:{H64.upper()}",
    f"artifact:s1:a.txt:{H12.upper()}",
    f"artifact:s1:a.txt:{H64[:13]}",
    f"artifact:s1:a.txt:{H64[:11]}",
    f"artifact:s1:a.txt:{H64[:32]}",
    f"artifact:s1:a.txt:{H64[:63]}",
    f"artifact:s1:a.txt:{H64}0",
    "artifact:s1:a.txt:" + "g" * 64,
    "artifact:s1:a.txt:",
    "artifact:s1:a.txt",
    f"artifact:s1:a.txt:{H64}\n",
    f"artifact:s1:a.txt:{H12[:-1]}\uff10",  # a full-width zero
    # the string as a whole
    "",
    " ",
    " transcript:s1:1",
    "transcript:s1:1 ",
    "\ufefftranscript:s1:1",
    "TRANSCRIPT:s1:1",
    "Transcript:s1:1",
    "transcript\uff1as1\uff1a1",  # FULLWIDTH COLON
    "transcript",
    "transcript:",
    ":s1:1",
    "1http:s1:1",
    "file:///etc/passwd",  # an unknown scheme, but not even the generic shape
    "http://example.com/x",
    "a.txt::$DATA",
    "store:",
    "store::1",
    "x" * 476,
    "transcript:s1:1" + "\u200b",
]

UNSUPPORTED = [
    "store:s1:42",
    "file:transcript:s1:1",  # unknown scheme "file" of the generic shape
    "transcripts:s1:1",
    "artifacts:s1:a.txt:" + H64,
    "x:y",
    "s3-bucket:key",
    "transcript-v2:s1:1",
]


@pytest.mark.parametrize(("text", "expected"), VALID, ids=range(len(VALID)))
def test_valid_pointers_parse_and_round_trip(text: str, expected: object) -> None:
    parsed = parse_pointer(text)
    assert isinstance(parsed, TranscriptPointer | ArtifactPointer)
    if expected is not None:
        assert parsed == expected
    assert format_pointer(parsed) == text


@pytest.mark.parametrize("text", CORRUPT, ids=range(len(CORRUPT)))
def test_corrupt_pointers(text: object) -> None:
    parsed = parse_pointer(text)
    assert isinstance(parsed, BadPointer)
    assert parsed.status == "corrupt"


@pytest.mark.parametrize("text", UNSUPPORTED)
def test_unknown_schemes_are_unsupported(text: str) -> None:
    assert parse_pointer(text) == BadPointer("unsupported", "unknown scheme")


def test_a_str_subclass_is_parsed_as_its_plain_value() -> None:
    class Sneaky(str):
        def split(self, *args: object, **kwargs: object) -> list[str]:
            return ["transcript", "..", "1"]

        def __hash__(self) -> int:
            return 0

    assert parse_pointer(Sneaky("transcript:s1:1")) == TranscriptPointer("s1", 1)
    assert parse_pointer(Sneaky("transcript:..:1")) == parse_pointer("transcript:..:1")


def test_reasons_never_echo_the_input() -> None:
    for text in [*CORRUPT, *UNSUPPORTED]:
        parsed = parse_pointer(text)
        assert isinstance(parsed, BadPointer)
        assert parsed.reason.isascii() and parsed.reason.isprintable()
        assert ":" not in parsed.reason and "s1" not in parsed.reason


@pytest.mark.parametrize(
    "value",
    [
        "s1",
        "a",
        "Z",
        "9",
        "a.b",
        "a-b",
        "a_b",
        "a..b",
        LONG,
        "3af9b1a7-6512-4883-ad18-320658ced099",
    ],
)
def test_valid_components(value: str) -> None:
    assert is_valid_component(value) and is_valid_session_id(value)


@pytest.mark.parametrize(
    "value",
    [
        "",
        ".",
        "..",
        ".a",
        "-a",
        "_a",
        "a.",
        "a..",
        "a/b",
        "a\\b",
        "a:b",
        "a b",
        "a\x00",
        "a\n",
        "\u0661",
        "\uff41",
        LONG + "a",
        "con",
        "CON",
        "con.txt",
        "aux.tar.gz",
        "COM1",
        "lpt9.x",
        "nul",
        "prn",
        None,
        1,
        b"s1",
    ],
)
def test_invalid_components(value: object) -> None:
    assert not is_valid_component(value) and not is_valid_session_id(value)


def test_digests() -> None:
    assert is_valid_digest(H64) and is_valid_digest(H12)
    for bad in (H64.upper(), H64[:13], H64[:63], "", None, "z" * 12):
        assert not is_valid_digest(bad)


def test_pointer_values_validate_on_construction() -> None:
    with pytest.raises(ValueError):
        TranscriptPointer("..", 1)
    with pytest.raises(ValueError):
        TranscriptPointer("s1", 0)
    with pytest.raises(ValueError):
        TranscriptPointer("s1", True)
    with pytest.raises(ValueError):
        TranscriptPointer("s1", MAX_SEQUENCE + 1)
    with pytest.raises(ValueError):
        ArtifactPointer("s1", "a/b", H64)
    with pytest.raises(ValueError):
        ArtifactPointer("s1", "a", H64.upper())


components = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,40}", fullmatch=True).filter(
    is_valid_component
)
pointers = st.one_of(
    st.builds(TranscriptPointer, components, st.integers(1, MAX_SEQUENCE)),
    st.builds(
        ArtifactPointer,
        components,
        components,
        st.one_of(
            st.from_regex(r"[0-9a-f]{12}", fullmatch=True),
            st.from_regex(r"[0-9a-f]{64}", fullmatch=True),
        ),
    ),
)


@given(pointers)
def test_format_then_parse_is_identity(pointer: TranscriptPointer | ArtifactPointer) -> None:
    assert parse_pointer(format_pointer(pointer)) == pointer


@given(st.one_of(st.text(), st.text(alphabet="transcriptartifact:0123456789s.-_ab\n\x00\u0661")))
def test_parse_never_raises_and_accepts_only_canonical_ascii(text: str) -> None:
    parsed = parse_pointer(text)
    if isinstance(parsed, BadPointer):
        assert parsed.status in ("corrupt", "unsupported")
    else:
        assert format_pointer(parsed) == text
        assert text.isascii() and text.isprintable() and " " not in text
