"""Money as people read it: amounts travel in integer minor units, and are shown in major ones.

Prices on the wire are integers of the currency's minor unit (cents for EUR), so sums are exact.
People read and type major units ("0.50 EUR"); the number of decimals is the currency's ISO 4217
exponent. :func:`format_money` and :func:`parse_money` convert, exactly, both ways.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

__all__ = ["exponent", "format_money", "parse_money"]

_EXPONENTS = {
    # ISO 4217 currencies without minor units, or with three decimals; every other has two
    "BIF": 0,
    "CLP": 0,
    "DJF": 0,
    "GNF": 0,
    "ISK": 0,
    "JPY": 0,
    "KMF": 0,
    "KRW": 0,
    "PYG": 0,
    "RWF": 0,
    "UGX": 0,
    "UYI": 0,
    "VND": 0,
    "VUV": 0,
    "XAF": 0,
    "XOF": 0,
    "XPF": 0,
    "BHD": 3,
    "IQD": 3,
    "JOD": 3,
    "KWD": 3,
    "LYD": 3,
    "OMR": 3,
    "TND": 3,
}


def exponent(currency: str) -> int:
    """Decimals of ``currency``'s minor unit (2 unless ISO 4217 says otherwise)."""
    return _EXPONENTS.get(currency.upper(), 2)


def format_money(minor: int, currency: str) -> str:
    """``50, "EUR"`` → ``"0.50 EUR"``; ``500, "JPY"`` → ``"500 JPY"``."""
    e = exponent(currency)
    amount = Decimal(minor).scaleb(-e)
    return f"{amount:.{e}f} {currency}"


def parse_money(text: str, currency: str) -> int:
    """``"0.50"`` (EUR) → ``50`` minor units, exactly; raise ValueError with a reason.

    More decimals than the currency has, negative or non-numeric amounts are refused rather
    than rounded: a price limit must mean what the buyer typed.
    """
    raw = text.strip()
    if raw.upper().endswith(currency.upper()):
        raw = raw[: -len(currency)].strip()
    try:
        amount = Decimal(raw)
    except InvalidOperation:
        raise ValueError(f"{text!r} is not an amount of {currency} (e.g. 0.50)") from None
    if not amount.is_finite() or amount < 0:
        raise ValueError(f"{text!r} is not an amount of {currency}: it must be 0 or more")
    e = exponent(currency)
    minor = amount.scaleb(e)
    if minor != minor.to_integral_value():
        raise ValueError(f"{currency} has {e} decimals; {text!r} has more")
    return int(minor)
