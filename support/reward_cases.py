"""Completions built to make a math reward hang or exhaust memory: the reward tests check that each finishes and
scores 0, the rewards benchmark times them."""

ADVERSARIAL = {
    "power tower": "\\boxed{2^{2^{2^{2^{2^{2^{2}}}}}}}",
    "plain power tower": "so the answer is 9^9^9^9^9",
    "huge factorial": "\\boxed{(10^{10})!}",
    "100 KB of digits": "9" * 100_000,
    "deeply nested braces": "\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}",
    "nested fractions": "\\boxed{" + "\\frac{1}{" * 300 + "2" + "}" * 300 + "}",
}
