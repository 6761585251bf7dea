"""Exact values of the LaTeX the math_style task writes: integers, decimals, `\\frac{}{}`,
`\\sqrt{}`, `+ - / \\cdot`, implicit products (`2\\sqrt{3}`, `2x`), parentheses and
variables.

A value is a sum of rational multiples of square roots of square-free integers (`Surd`), so
`\\sqrt{8}` and `2\\sqrt{2}` are the same value and no float is ever compared. What falls
outside (a root of a root, a division by a root, an unknown command) reads as None: the step
checker counts such a line wrong, and the final answer goes through math-verify instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction

# A value: square-free radicand -> its rational coefficient (1 -> the rational part), no zeros.
Surd = tuple[tuple[int, Fraction], ...]

_TOKEN = re.compile(r"\\frac|\\sqrt|\\cdot|\\left|\\right|\d+(?:\.\d+)?|[a-z]|[-+/(){}]|\S")


def surd(coefficients: Mapping[int, Fraction | int]) -> Surd:
    """The canonical value of a sum `coefficient * sqrt(radicand)` (radicands square-free)."""
    return tuple(sorted((r, Fraction(c)) for r, c in coefficients.items() if c != 0))


def rational(value: Fraction | int) -> Surd:
    return surd({1: value})


def _add(a: Surd, b: Surd, sign: int = 1) -> Surd:
    total = dict(a)
    for radicand, c in b:
        total[radicand] = total.get(radicand, Fraction(0)) + sign * c
    return surd(total)


def square_free_split(n: int) -> tuple[int, int]:
    """(s, k) with n = s^2 * k and k square-free, for n >= 1."""
    outside, rest, p = 1, n, 2
    while p * p <= rest:
        while rest % (p * p) == 0:
            outside, rest = outside * p, rest // (p * p)
        p += 1
    return outside, rest


def _mul(a: Surd, b: Surd) -> Surd:
    total: dict[int, Fraction] = {}
    for ra, ca in a:
        for rb, cb in b:
            outside, radicand = square_free_split(ra * rb)
            total[radicand] = total.get(radicand, Fraction(0)) + ca * cb * outside
    return surd(total)


def _as_rational(a: Surd) -> Fraction | None:
    if not a:
        return Fraction(0)
    return a[0][1] if len(a) == 1 and a[0][0] == 1 else None


def _inverse(a: Surd) -> Surd:
    """1/a for a nonzero rational; a root or zero below the line is not in this subset."""
    value = _as_rational(a)
    if not value:
        raise ValueError("a divisor must be a nonzero rational")
    return rational(1 / value)


def _sqrt(a: Surd) -> Surd | None:
    """sqrt of a non-negative rational p/q = sqrt(p*q)/q; None for anything else."""
    value = _as_rational(a)
    if value is None or value < 0:
        return None
    if value == 0:
        return ()
    outside, radicand = square_free_split(value.numerator * value.denominator)
    return surd({radicand: Fraction(outside, value.denominator)})


class _Parser:
    """Recursive descent over the tokens of one side of an equation."""

    def __init__(self, text: str, variables: Mapping[str, Surd]) -> None:
        compact = "".join(text.split())
        self.tokens = [t for t in _TOKEN.findall(compact) if t not in ("\\left", "\\right")]
        self.at = 0
        self.variables = variables

    def _peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def _take(self, expected: str | None = None) -> str:
        token = self._peek()
        if token is None or (expected is not None and token != expected):
            raise ValueError(f"expected {expected or 'more'} at token {self.at}")
        self.at += 1
        return token

    def whole(self) -> Surd:
        value = self.sum()
        if self._peek() is not None:
            raise ValueError(f"unread {self._peek()!r}")
        return value

    def sum(self) -> Surd:
        sign = -1 if self._peek() == "-" else 1
        if self._peek() in ("+", "-"):
            self._take()
        value = _mul(rational(sign), self.product())
        while self._peek() in ("+", "-"):
            sign = 1 if self._take() == "+" else -1
            value = _add(value, self.product(), sign)
        return value

    def product(self) -> Surd:
        value = self.factor()
        while True:
            token = self._peek()
            if token in ("\\cdot", "/"):
                self._take()
            elif token is None or token in ("+", "-", ")", "}"):
                return value
            right = self.factor()
            value = _mul(value, _inverse(right) if token == "/" else right)

    def _group(self) -> Surd:
        self._take("{")
        value = self.sum()
        self._take("}")
        return value

    def factor(self) -> Surd:
        token = self._take()
        if token == "\\frac":
            numerator = self._group()
            return _mul(numerator, _inverse(self._group()))
        if token == "\\sqrt":
            root = _sqrt(self._group())
            if root is None:
                raise ValueError("only roots of non-negative rationals")
            return root
        if token == "(":
            value = self.sum()
            self._take(")")
            return value
        if token in self.variables:
            return self.variables[token]
        if token[0].isdigit():
            return rational(Fraction(token))
        raise ValueError(f"unknown token {token!r}")


def evaluate(text: str, variables: Mapping[str, Surd] | None = None) -> Surd | None:
    """The exact value of `text` (spaces ignored), variables taking the given values; None
    when it is empty or outside the subset."""
    try:
        return _Parser(text, variables or {}).whole()
    except (ValueError, ZeroDivisionError):
        return None


def to_latex(value: Surd) -> str:
    """LaTeX of a value as the task writes it: `\\frac{5}{6}`, `3\\sqrt{2}`, `-\\sqrt{3}`, `2`;
    a sum of terms for mixed radicands (`1+\\sqrt{2}`)."""
    if not value:
        return "0"
    terms = []
    for radicand, c in value:
        magnitude = abs(c)
        if radicand == 1:
            body = _fraction_latex(magnitude)
        elif magnitude == 1:
            body = f"\\sqrt{{{radicand}}}"
        elif magnitude.denominator == 1:
            body = f"{magnitude.numerator}\\sqrt{{{radicand}}}"
        else:
            body = f"\\frac{{{magnitude.numerator}\\sqrt{{{radicand}}}}}{{{magnitude.denominator}}}"
        terms.append(("-" if c < 0 else "+") + body)
    text = "".join(terms)
    return text[1:] if text.startswith("+") else text


def _fraction_latex(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    return f"\\frac{{{value.numerator}}}{{{value.denominator}}}"
