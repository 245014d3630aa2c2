"""The calculator tool: arithmetic on numbers, evaluated by walking Python's AST (never `eval`).

Only numbers, + - * / // % ** and parentheses are accepted. Every intermediate result is bounded (a power
tower or a 10^10^10 would otherwise take the whole machine), so any input answers in microseconds.
"""

import ast
import math
import operator

MAX_EXPRESSION_CHARS = 200
MAX_MAGNITUDE = 1e100  # larger intermediates are refused
MAX_EXPONENT = 100

BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    pass


def calculate(expression: str) -> int | float:
    """The value of an arithmetic expression; CalculatorError (with a message for the policy) otherwise."""
    # Common ways of writing arithmetic that Python's grammar lacks.
    text = expression.strip().replace("×", "*").replace("÷", "/").replace("^", "**").replace(",", "")
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise CalculatorError(f"not an arithmetic expression: {expression.strip()[:40]!r}") from None
    return _value(tree.body)


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > MAX_EXPONENT or (left == 0 and right < 0)):
            raise CalculatorError(f"exponent {right} out of range")
        try:
            return _bounded(BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("number too large") from None
    raise CalculatorError(f"only numbers and + - * / // % ** ( ) are allowed, not {type(node).__name__}")


def _bounded(value) -> int | float:
    if isinstance(value, complex) or (isinstance(value, float) and not math.isfinite(value)):
        raise CalculatorError("not a real number")
    if abs(value) > MAX_MAGNITUDE:
        raise CalculatorError("number too large")
    return value


def format_number(value: int | float) -> str:
    """408, not 408.0; at most 10 significant digits for a fraction."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.10g}" if isinstance(value, float) else str(value)
