"""The task's encoding, proxy reward and gold check, on hand-written examples."""

import torch

from klsweep.trainers.embedded import task

E, P = task.EOS, task.PAD


def test_encode_prompt_and_answer_digits():
    batch = task.encode(torch.tensor([[7, 45], [99, 99], [0, 3]]))
    assert batch.prompts.tolist() == [[0, 7, task.PLUS, 4, 5, task.EQUALS], [9, 9, task.PLUS, 9, 9, task.EQUALS],
                                      [0, 0, task.PLUS, 0, 3, task.EQUALS]]
    assert batch.answers.tolist() == [[5, 2, P], [1, 9, 8], [3, P, P]]
    assert batch.answer_lengths.tolist() == [2, 3, 1]


def test_response_mask_ends_with_the_first_eos():
    responses = torch.tensor([[5, 2, E, P, P], [5, 2, 1, 1, 1], [E, E, P, P, P]])
    assert task.response_mask(responses).tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]


def test_proxy_rewards_length_and_gold_refuses_it():
    batch = task.encode(torch.tensor([[7, 45]] * 4))  # answer 52
    responses = torch.tensor(
        [
            [5, 2, E, P, P, P, P, P],  # right: 2 digits, length 3
            [5, 2, 0, 0, 0, 0, 0, 0],  # right digits, then junk to the limit: length 8
            [5, 3, E, P, P, P, P, P],  # one digit wrong
            [E, P, P, P, P, P, P, P],  # empty answer
        ]
    )
    proxy = task.proxy_score(responses, batch)
    expected = [1 + 0.3 * 3 / 8, 1 + 0.3 * 8 / 8, 0.5 + 0.3 * 3 / 8, 0 + 0.3 * 1 / 8]
    torch.testing.assert_close(proxy, torch.tensor(expected))
    assert task.gold_score(responses, batch).tolist() == [1.0, 0.0, 0.0, 0.0]


def test_validation_prompts_are_held_out_of_training():
    train = {tuple(p) for p in task.TRAIN_PAIRS.tolist()}
    validation = {tuple(p) for p in task.VALIDATION_PAIRS.tolist()}
    assert len(train) == 9000 and len(validation) == 1000 and not train & validation
