"""What a tool call gives back to the policy."""

from dataclasses import dataclass


@dataclass(frozen=True)
class ToolResult:
    output: str  # what the policy reads: the tool's output, or "error: ..." saying why the call failed
    error: bool  # the call failed (bad input, a refused import, a time limit...)
