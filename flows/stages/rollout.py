"""The rollout stage of iteration k: G samples per train prompt from policy_k, the raw
material of the reward models' labels."""

from __future__ import annotations

from flows.context import RunContext
from flows.names import POLICY, ROLLOUT, TRAIN_SPLIT
from flows.progress import ProgressFn
from flows.stage_results import StageResult, mean, metric_rows
from grpo_core.contracts.rollout import SamplingParams


def rollout_stage(ctx: RunContext, iteration: int, progress: ProgressFn) -> StageResult:
    """G samples per train prompt from policy_k: the raw material of the RM labels."""
    rollout, task = ctx.cfg.rollout, ctx.task
    model, tokenizer = ctx.policy(iteration)
    seed = ctx.seed(ROLLOUT, iteration)
    problems = task.problems(TRAIN_SPLIT, rollout.prompts, seed=seed)
    prompter = ctx.prompter(tokenizer)
    prompts = [prompter(p.question) for p in problems]
    params = SamplingParams(
        max_new_tokens=rollout.max_new_tokens,
        temperature=rollout.temperature,
        top_p=rollout.top_p,
    )
    engine = ctx.sampler("rollout", iteration, model, tokenizer, rollout.batch_size)
    batch = engine.generate(prompts, rollout.group_size, params, seed=seed)
    progress(0.9, f"writing {len(batch)} rollouts")
    # Relative to the store root, so a moved or copied store still resolves it.
    policy_dir = str(ctx.checkpoint(POLICY, iteration).relative_to(ctx.store.root))
    rollouts = []
    for r, text in enumerate(batch.texts):
        i = batch.prompt_index[r]
        rollouts.append(
            {
                "problem_id": problems[i].problem_id,
                "sample_index": r % rollout.group_size,
                "prompt_text": prompts[i],
                "completion": text,
                "n_prompt_tokens": len(batch.prompt_ids[r]),
                "n_completion_tokens": len(batch.completion_ids[r]),
                "finish_reason": batch.finish_reasons[r],
                "temperature": params.temperature,
                "top_p": params.top_p,
                "seed": seed,
                "policy_checkpoint": policy_dir,
                "correct": task.is_correct(problems[i], text),
                "extracted_answer": task.answer_format.extract(text),
            }
        )
    accuracy = mean(r["correct"] for r in rollouts)
    prompt_rows = [
        {
            "problem_id": p.problem_id,
            "split": TRAIN_SPLIT,
            "question": p.question,
            "answer": p.answer,
            "prompt_text": text,
        }
        for p, text in zip(problems, prompts, strict=True)
    ]
    with ctx.run.stage(iteration, ROLLOUT) as attempt:
        attempt.write("prompts", prompt_rows)
        attempt.write("rollouts", rollouts)
        attempt.write("metrics", metric_rows(ROLLOUT, {"accuracy": accuracy}))
    return StageResult(ROLLOUT, iteration, metrics={"accuracy": accuracy})
