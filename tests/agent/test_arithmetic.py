"""Tests for the calculator's evaluator: what it computes, what it refuses, its bounds."""

from __future__ import annotations

import pytest

from service.agent.arithmetic import CalculatorError, CalculatorLimits, calculate, evaluate, format_number

# No bound on integer size.
RELAXED = CalculatorLimits(max_int_bits=10**12)


def calc(expression: str) -> str:
    """Evaluate and format, as the calculator tool does."""
    return format_number(evaluate(expression))


# ---------------------------------------------------------------------------------------------
# Calculator: what it computes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("1 + 2 * 3", "7"),
        ("(1 + 2) * 3", "9"),
        ("2 * 3 ** 2", "18"),
        ("-3 ** 2", "-9"),
        ("10 - 4 - 3", "3"),
        ("2 ** 3 ** 2", "512"),
        ("7 / 2", "3.5"),
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),
        ("7 % 3", "1"),
        ("+5", "5"),
        ("sqrt(144)", "12"),
        ("2**0.5", "1.4142135623730951"),
        ("factorial(5)", "120"),
        ("2^10", "1024"),
        ("2 ^ 3 ^ 2", "512"),
        ("6 × 7", "42"),
        ("9 ÷ 2", "4.5"),
        ("2**-2", "0.25"),
        ("0.1 + 0.2", "0.30000000000000004"),
        ("pi", "3.141592653589793"),
        ("tau / 2", "3.141592653589793"),
        ("log(e)", "1"),
        ("log(8, 2)", "3"),
        ("log10(1000)", "3"),
        ("atan2(1, 1) * 4", "3.141592653589793"),
        ("degrees(pi)", "180"),
        ("floor(-2.5)", "-3"),
        ("ceil(2.1)", "3"),
        ("abs(-4)", "4"),
        ("round(2.567, 2)", "2.57"),
        ("round(2.5)", "2"),
        ("pow(2, 10)", "1024"),
        ("hypot(3, 4)", "5"),
        ("gcd(12, 18)", "6"),
        ("lcm(4, 6)", "12"),
        ("comb(10, 3)", "120"),
        ("perm(5, 2)", "20"),
        ("trunc(-2.7)", "-2"),
        ("min(3, 1, 2)", "1"),
        ("max(3, 1, 2.5)", "3"),
        ("cbrt(-8)", "-2"),
        ("factorial(sqrt(25))", "120"),
        ("1e15", "1000000000000000.0"),
        ("1e14", "100000000000000"),
        ("2**100", "1267650600228229401496703205376"),
        ("  1 + 1  ", "2"),
    ],
)
def test_calculator_computes(expression: str, expected: str) -> None:
    assert calc(expression) == expected


def test_calculator_allows_integers_up_to_the_limit() -> None:
    assert evaluate("2**9999") == 2**9999
    assert evaluate("(2**9999 - 1) * 2 + 1") == 2**10000 - 1


def test_calculator_result_types() -> None:
    assert isinstance(evaluate("6 * 7"), int)
    assert isinstance(evaluate("sqrt(144)"), float)


# ---------------------------------------------------------------------------------------------
# Calculator: what it refuses
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        # Running code.
        ("__import__('os')", "unknown name '__import__'"),
        ("open('x')", "unknown name 'open'"),
        ("().__class__", "unsupported expression: attribute access"),
        ("math.sqrt(2)", "unsupported expression: only named functions can be called"),
        ("(1).real", "unsupported expression: attribute access"),
        ("x[0]", "unsupported expression: subscript"),
        ("lambda: 1", "unsupported expression: lambda"),
        ("[x for x in (1, 2)]", "unsupported expression: comprehension"),
        ("sqrt(x=4)", "unsupported expression: keyword arguments"),
        ("max(*(1, 2))", "unsupported expression: starred argument"),
        ("1 < 2", "unsupported expression: comparison"),
        ("1 and 2", "unsupported expression: boolean operator"),
        ("1 if 1 else 2", "unsupported expression: conditional expression"),
        ("(1, 2)", "unsupported expression: tuple"),
        ("(y := 2)", "unsupported expression: assignment"),
        ("x", "unknown name 'x'"),
        ("sqrt", "'sqrt' is a function"),
        ("import os", "invalid expression"),
        ("1 +", "invalid expression"),
        ("", "empty expression"),
        ("   ", "empty expression"),
        ("1\0", "invalid expression"),
        # Values that are not numbers.
        ("'abc'", "only numbers allowed"),
        ("'a' * 10**9", "only numbers allowed"),
        ("b'x'", "only numbers allowed"),
        ("1j", "only numbers allowed"),
        ("True + 1", "booleans are not numbers"),
        ("None", "only numbers allowed"),
        ("(-8) ** (1/3)", "not a real number"),
        # Operators that are not arithmetic.
        ("1 << 5", "unsupported operator '<<'"),
        ("256 >> 2", "unsupported operator '>>'"),
        ("6 & 3", "unsupported operator '&'"),
        ("6 | 3", "unsupported operator '|'"),
        ("~1", "unsupported operator '~'"),
        ("not 1", "unsupported operator 'not'"),
        # Arithmetic errors.
        ("1 / 0", "division by zero"),
        ("1 // 0", "division by zero"),
        ("1 % 0", "division by zero"),
        ("1.5 / 0.0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("sqrt(-1)", "math domain error"),
        ("log(0)", "math domain error"),
        ("acos(2)", "math domain error"),
        ("exp(1000)", "numeric overflow"),
        ("1e308 * 10", "numeric overflow"),
        ("10.0 ** 400", "numeric overflow"),
        ("10**400 / 3", "numeric overflow"),
        ("hypot(10**400, 1)", "numeric overflow"),
        ("1e999", "number too large"),
        # Expensive work, refused before it starts.
        ("9**9**9", "integer result too large (limit is 10000 bits)"),
        ("10**10**10", "integer result too large (limit is 10000 bits)"),
        ("2**10000", "integer result too large (limit is 10000 bits)"),
        ("pow(7, 10**6)", "integer result too large (limit is 10000 bits)"),
        ("(2**9999) * (2**9999)", "integer result too large (limit is 10000 bits)"),
        ("factorial(100000)", "factorial() needs an integer from 0 to 1000"),
        ("factorial(1001)", "factorial() needs an integer from 0 to 1000"),
        ("factorial(-1)", "factorial() needs an integer from 0 to 1000"),
        ("factorial(2.5)", "factorial() needs integer arguments"),
        ("comb(100000, 50000)", "comb() arguments must be at most 10000"),
        ("perm(100000)", "perm() arguments must be at most 10000"),
        ("perm(10000)", "integer result too large"),
        ("round(1.5, 0.5)", "round() needs integer arguments"),
        # Wrong arity.
        ("sqrt(1, 2)", "sqrt() takes 1 argument (2 given)"),
        ("log()", "log() takes 1 or 2 arguments (0 given)"),
        ("atan2(1)", "atan2() takes 2 arguments (1 given)"),
        ("max()", "max() takes at least 1 arguments (0 given)"),
        # Size limits.
        ("1" + " + 1" * 200, "expression too complex"),
        ("-" * 60 + "1", "expression nested too deeply"),
        ("sqrt(" * 60 + "1" + ")" * 60, "expression nested too deeply"),
        ("(" * 300 + "1" + ")" * 300, "invalid expression"),
        ("1" * 1001, "expression too long: 1001 characters (limit is 1000)"),
        ("'" + "a" * 5000 + "'", "expression too long"),
    ],
)
def test_calculator_refuses(expression: str, message: str) -> None:
    with pytest.raises(CalculatorError) as caught:
        evaluate(expression)
    assert message in str(caught.value)


def test_calculator_refuses_non_strings() -> None:
    with pytest.raises(CalculatorError, match="expression must be a string"):
        evaluate(12)  # type: ignore[arg-type]


def test_calculator_error_is_a_value_error() -> None:
    assert issubclass(CalculatorError, ValueError)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (12, "12"),
        (12.0, "12"),
        (-0.0, "0"),
        (1.5, "1.5"),
        (1e15, "1000000000000000.0"),
        (999999999999999.0, "999999999999999"),
        (2**0.5, "1.4142135623730951"),
    ],
)
def test_format_number(value: float, expected: str) -> None:
    assert format_number(value) == expected


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_format_number_refuses_non_finite(value: float) -> None:
    with pytest.raises(ValueError, match="not a finite number"):
        format_number(value)


# ---------------------------------------------------------------------------------------------
# Bounds
# ---------------------------------------------------------------------------------------------


def test_limits_can_be_tightened() -> None:
    limits = CalculatorLimits(max_expression_chars=20, max_depth=3, max_nodes=10)
    with pytest.raises(CalculatorError, match=r"too long: 21 characters \(limit is 20\)"):
        evaluate("1" * 21, limits)
    with pytest.raises(CalculatorError, match=r"nested too deeply \(limit is 3 levels\)"):
        evaluate("----1", limits)
    with pytest.raises(CalculatorError, match=r"too complex: 11 parts \(limit is 10\)"):
        evaluate("1+2+3+4+5+6", limits)
    assert evaluate("-(-1)", limits) == 1


def test_limits_apply_only_to_their_evaluation() -> None:
    assert int(calculate("2**12000", RELAXED)) == 2**12000
    with pytest.raises(CalculatorError, match="integer result too large"):
        evaluate("2**12000")
