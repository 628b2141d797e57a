"""bench.draft_replay's greedy replay, on made-up token lists (no model)."""
from bench.draft_replay import replay


def test_a_copied_answer_takes_one_step_per_k_plus_one_tokens():
    prompt = [7, 8] + list(range(100, 140)) + [9]
    answer = [7, 8] + list(range(100, 118))          # 20 tokens, the first two start the copy
    counts = replay(prompt, answer, None, (2,), k=4, follow=True)
    # step 1: no suffix yet (one token); step 2 (suffix 7: too short); then 5 tokens a step
    assert counts["tokens"] == 20 and counts["accepted"] == counts["tokens"] - counts["steps"]
    assert counts["steps"] == 2 + 18 // 5 + (1 if 18 % 5 else 0)


def test_an_answer_with_nothing_to_copy_takes_a_step_per_token():
    counts = replay([1, 2, 3], [50, 51, 52, 53], None, (2,), k=4, follow=False)
    assert counts == {"tokens": 4, "steps": 4, "drafted": 0, "accepted": 0}
