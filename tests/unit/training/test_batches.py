import torch

from memfit.training.batches import BatchStream, eval_batches


def collate(examples):
    return {"x": torch.stack(examples)}


def test_every_epoch_is_a_permutation_and_batches_straddle_epochs():
    data = [torch.tensor([i]) for i in range(10)]
    stream = BatchStream(data, micro_batch_size=4, seed=3, collate=collate)
    seen = torch.cat([stream.next_batch()["x"] for _ in range(5)]).flatten().tolist()
    assert sorted(seen[:10]) == list(range(10))
    assert sorted(seen[10:20]) == list(range(10))
    assert seen[:10] != seen[10:20]  # a new order each epoch


def test_resumed_stream_reads_the_same_batches():
    data = [torch.tensor([i]) for i in range(7)]
    uninterrupted = BatchStream(data, 3, seed=1, collate=collate)
    expected = [uninterrupted.next_batch()["x"].tolist() for _ in range(6)]
    first = BatchStream(data, 3, seed=1, collate=collate)
    head = [first.next_batch()["x"].tolist() for _ in range(2)]
    resumed = BatchStream(data, 3, seed=1, collate=collate, consumed=first.consumed)
    tail = [resumed.next_batch()["x"].tolist() for _ in range(4)]
    assert head + tail == expected


def test_eval_batches_cover_the_split_in_order_or_its_first_items():
    data = [torch.tensor([i]) for i in range(7)]
    batches = lambda size, limit=None: [b["x"].flatten().tolist()  # noqa: E731
                                        for b in eval_batches(data, size, collate, limit)]
    assert batches(3) == [[0, 1, 2], [3, 4, 5], [6]]
    # train.eval_max_batches=2 at micro-batch 2: the first 4 items, also at a halved batch
    assert batches(2, limit=4) == [[0, 1], [2, 3]]
    assert batches(1, limit=4) == [[0], [1], [2], [3]]
    assert batches(3, limit=100) == batches(3)
