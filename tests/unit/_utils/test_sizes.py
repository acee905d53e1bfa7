import pytest

from memfit._utils.sizes import format_bytes, parse_bytes


@pytest.mark.parametrize("text, expected", [
    ("24GiB", 24 * 2**30), ("512MiB", 512 * 2**20), ("16GB", 16 * 10**9),
    ("1e9", 10**9), (1024, 1024), ("1.5 KiB", 1536),
])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


def test_parse_bytes_rejects_unknown_units():
    with pytest.raises(ValueError, match="GiB"):
        parse_bytes("12 parsecs")


def test_format_bytes_is_binary():
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 * 2**30) == "3.00 GiB"
    assert format_bytes(12) == "12 B"
