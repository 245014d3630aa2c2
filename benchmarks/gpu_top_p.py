"""The top_p question on a GPU: `PYTHONPATH=src python3 -m benchmarks.gpu_top_p` (CUDA; torch and transformers only).

SmolLM2-135M's architecture with random weights, a float32 policy and its bfloat16 sampling copy (SamplingCopy), 16
prompts x 32 new tokens at temperature 0.7, for top_p 1.0, 0.9 and 0.5. For each, per sampled token:
- what the copy hands TRL now (its whole distribution at the temperature) against the copy's own teacher-forced
  log-probabilities (the same distribution, up to bfloat16 rounding between cached and full forwards) and against
  the float32 policy's (the sampler/trainer mismatch TRL's ratio then carries);
- what it handed before the fix (generate()'s processed scores: the top-p truncated, renormalised distribution)
  against the float32 policy's: the first update's ratio exp(new - old) it implied, which is the kept mass.
"""

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from benchmarks.gpu_generation import SMOLLM2_135M, prompts
from grpo_exp.trainer.sampling_copy import SamplingCopy


def teacher_forced(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    ids = torch.tensor([prompt + completion], device=model.device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion, device=model.device)[:, None])[:, 0]


def main() -> None:
    torch.manual_seed(0)
    policy = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).cuda()
    sampler = SamplingCopy(policy)
    sampler.sync(policy, step=0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; SmolLM2-135M architecture, random weights")
    ids = prompts(16)
    for top_p in (1.0, 0.9, 0.5):
        config = GenerationConfig(
            do_sample=True, temperature=0.7, top_k=0, top_p=top_p, max_new_tokens=32, pad_token_id=2, eos_token_id=[2]
        )
        torch.manual_seed(1)
        completions, handed = sampler.generate(ids, config)
        # what the copy handed before the fix: the processed scores of the same draw
        sampler.copy.generation_config = config
        torch.manual_seed(1)
        batch = torch.tensor(ids, device=policy.device)
        out = sampler.copy.generate(input_ids=batch, attention_mask=torch.ones_like(batch), output_scores=True,
                                    return_dict_in_generate=True)  # fmt: skip
        new = out.sequences[:, batch.shape[1] :]
        processed = torch.stack(
            [torch.log_softmax(s.float(), -1).gather(1, new[:, t : t + 1])[:, 0] for t, s in enumerate(out.scores)], 1
        )
        own, mismatch, before = [], [], []
        for row, (prompt, completion, sampled) in enumerate(zip(ids, completions, handed, strict=True)):
            sampled = torch.tensor(sampled, device=policy.device)
            copy_logps = teacher_forced(sampler.copy, prompt, completion, 0.7)
            policy_logps = teacher_forced(policy, prompt, completion, 0.7)
            own.append((sampled - copy_logps).abs())
            mismatch.append((sampled - policy_logps).abs())
            before.append(torch.exp(policy_logps - processed[row, : len(completion)]))
        own, mismatch, before = (torch.cat(x) for x in (own, mismatch, before))
        print(
            f"  top_p {top_p}: {own.numel()} tokens; handed now vs the copy's own |diff| mean {own.mean():.4f}; vs the "
            f"float32 policy {mismatch.mean():.4f} (max {mismatch.max():.3f}); before the fix, the first update's "
            f"ratio mean {before.mean():.3f} (min {before.min():.3f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
