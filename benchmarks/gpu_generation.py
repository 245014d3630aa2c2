"""On a CUDA GPU: generation=transformers_bf16's sampler and the shared-prompt loss forward, checked and timed.

    python -m benchmarks.gpu_generation      (needs torch with CUDA and transformers; not part of `make bench`)

It imports only grpo_exp's torch-level modules, so that it runs on a GPU machine with no hub, no TRL and no Hydra.
The model is SmolLM2-135M's architecture with random weights, a float32 policy as TRL trains it; random weights
decode at the speed trained ones do (every step runs to the same length here).
- Decode ms per token-step, float32 policy's generate() against the bfloat16 copy (SamplingCopy), batch 8 and 64.
- The copy's log-probabilities as it returns them against its own teacher-forced ones, and against the float32
  policy's (the gap the loss ratio corrects).
- shared_prompt_forward's packed log-probabilities against TRL's row layout on CUDA (sdpa with a boolean mask).
"""

import statistics
import time

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from grpo_exp.trainer.sampling_copy import SamplingCopy
from grpo_exp.trainer.shared_prompt import pack_groups, unpack

SMOLLM2_135M = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)
PROMPT_TOKENS, GROUP = 62, 4


def prompts(batch: int, seed: int = 0, length: int = PROMPT_TOKENS, group: int = GROUP) -> list[list[int]]:
    """batch / G prompts of random tokens (no EOS), each repeated G times as TRL batches a group."""
    generator = torch.Generator().manual_seed(seed)
    distinct = [torch.randint(3, 49152, (length,), generator=generator).tolist() for _ in range(batch // group)]
    return [p for p in distinct for _ in range(group)]


def seconds(run) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    run()
    torch.cuda.synchronize()
    return time.perf_counter() - started


def per_token_step_ms(generate, repeats: int = 7) -> float:
    """(72 - 8 new tokens) / 64 steps: prefill cancels out; median of `repeats` after a warm-up."""
    generate(8)
    return statistics.median(
        (seconds(lambda: generate(72)) - seconds(lambda: generate(8))) / 64 * 1000 for _ in range(repeats)
    )


def config(tokens: int) -> GenerationConfig:
    return GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=tokens,
        min_new_tokens=tokens,
        pad_token_id=2,
        eos_token_id=[2],
    )


def float32_generate(policy, ids: list[list[int]]):
    input_ids = torch.tensor(ids, device="cuda")  # equal lengths: no padding

    def generate(tokens: int):
        with torch.no_grad():
            policy.generate(
                input_ids=input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config(tokens)
            )

    return generate


def teacher_forced(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + completion], device="cuda")
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion, device="cuda")[:, None]).squeeze(1)


def log_prob_gaps(policy, sampler) -> tuple[float, float]:
    ids = prompts(8, seed=1)
    completions, sampled = sampler.generate(ids, config(32))
    own, to_policy = [], []
    for prompt, completion, logps in zip(ids, completions, sampled, strict=True):
        logps = torch.tensor(logps, device="cuda")
        own.append((logps - teacher_forced(sampler.copy, prompt, completion)).abs().max())
        to_policy.append((logps - teacher_forced(policy, prompt, completion)).abs().mean())
    return float(torch.stack(own).max()), float(torch.stack(to_policy).mean())


def packed_forward_gap(policy, batch: int, prompt: int, group: int, longest: int) -> tuple[float, float, float]:
    """max |packed - row layout| of the completion log-probabilities, and each layout's forward + backward ms, for
    `batch` rows in groups of `group` sharing a prompt of `prompt` tokens, completions of longest/3 to `longest`."""
    ids = prompts(batch, seed=2, length=prompt, group=group)
    generator = torch.Generator().manual_seed(3)
    completions = [
        torch.randint(3, 49152, (int(n),), generator=generator).tolist()
        for n in torch.randint(longest // 3, longest + 1, (batch,), generator=generator)
    ]
    width = max(len(c) for c in completions)
    rows = torch.tensor([p + c + [2] * (width - len(c)) for p, c in zip(ids, completions, strict=True)])
    mask = torch.tensor([[1] * prompt + [1] * len(c) + [0] * (width - len(c)) for c in completions])
    labels = rows[:, prompt:].cuda()

    def rows_layout():
        logits = policy(input_ids=rows.cuda(), attention_mask=mask.cuda()).logits[:, prompt - 1 : -1]
        return torch.log_softmax(logits.float(), -1).gather(2, labels[..., None]).squeeze(2)

    packed = pack_groups(rows, mask, width, pad_id=2, max_tokens=1 << 16)

    def packed_layout():
        logits = policy(
            input_ids=packed.input_ids.cuda(),
            attention_mask=packed.allowed.cuda(),
            position_ids=packed.position_ids.cuda(),
        ).logits
        targets = packed.shift_labels.cuda().clamp(min=0)
        values = torch.log_softmax(logits.float(), -1).gather(2, targets[..., None]).squeeze(2)
        return unpack(values, packed, width)

    completion_mask = mask[:, prompt:].cuda().bool()
    gap = float((rows_layout() - packed_layout()).detach()[completion_mask].abs().max())
    timings = []
    for layout in (rows_layout, packed_layout):
        layout()[completion_mask].sum().backward()  # warm-up
        timings.append(
            statistics.median(
                seconds(lambda layout=layout: layout()[completion_mask].sum().backward()) * 1000 for _ in range(21)
            )
        )
    return gap, *timings


def main() -> None:
    torch.manual_seed(0)
    policy = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).cuda()  # float32, sdpa
    sampler = SamplingCopy(policy)
    sampler.sync(policy, step=0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; SmolLM2-135M architecture, random weights")
    for batch in (8, 64):
        ids = prompts(batch)
        fp32 = per_token_step_ms(float32_generate(policy, ids))
        bf16 = per_token_step_ms(lambda tokens, ids=ids: sampler.generate(ids, config(tokens)))
        print(
            f"  decode batch {batch:2d}: float32 policy {fp32:6.2f} ms/token-step, bfloat16 copy {bf16:6.2f} "
            f"({bf16 / fp32:.2f}x)",
            flush=True,
        )
    own, to_policy = log_prob_gaps(policy, sampler)
    print(
        f"  copy's log-probs: max |returned - its teacher-forced| {own:.4f}; mean |returned - float32 policy's| "
        f"{to_policy:.4f}"
    )
    for batch, prompt, group, longest in ((8, PROMPT_TOKENS, GROUP, 64), (16, 512, 8, 256)):
        gap, rows_ms, packed_ms = packed_forward_gap(policy, batch, prompt, group, longest)
        print(
            f"  shared-prompt forward, {batch} rows, G={group}, prompt {prompt}, completions <= {longest}: "
            f"max |packed - rows| {gap:.2e}; forward+backward rows {rows_ms:.1f} ms, packed {packed_ms:.1f} ms "
            f"({packed_ms / rows_ms:.2f}x)"
        )


if __name__ == "__main__":
    main()
