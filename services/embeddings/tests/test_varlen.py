"""PackedLayout: packed rows <-> the padded grid attention sees, positions per input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from jacana_embeddings.varlen import PackedLayout, flatten_ids

CPU = torch.device("cpu")


def test_round_trip_through_the_padded_grid():
    layout = PackedLayout([3, 1, 5], CPU)
    assert (layout.batch_size, layout.max_len, layout.num_tokens) == (3, 5, 9)
    assert not layout.dense
    x = torch.arange(1, 10, dtype=torch.float32)[:, None].repeat(1, 2)  # [T, 2]
    padded = layout.to_padded(x)  # [B, S, 2]
    expected = torch.tensor(
        [[1, 2, 3, 0, 0], [4, 0, 0, 0, 0], [5, 6, 7, 8, 9]], dtype=torch.float32
    )
    torch.testing.assert_close(padded[..., 0], expected)
    assert layout.key_mask.tolist() == (expected > 0).tolist()
    assert layout.attention_mask.shape == (3, 1, 1, 5)
    torch.testing.assert_close(layout.to_packed(padded), x)
    # Trailing dimensions are flattened on the way back: [B, S, heads, d] -> [T, heads * d].
    four_d = padded.view(3, 5, 2, 1)
    torch.testing.assert_close(layout.to_packed(four_d), x)


def test_positions_restart_per_input():
    layout = PackedLayout([3, 1, 5], CPU)
    assert layout.positions().tolist() == [0, 1, 2, 0, 0, 1, 2, 3, 4]
    flags = torch.tensor([1, 0, 1, 1, 1, 1, 0, 0, 1])
    assert layout.segment_cumsum(flags).tolist() == [1, 1, 2, 1, 1, 2, 2, 2, 3]


def test_equal_lengths_need_no_copies_and_no_mask():
    layout = PackedLayout([4, 4], CPU)
    assert layout.dense and layout.attention_mask is None
    x = torch.randn(8, 3)
    padded = layout.to_padded(x)
    assert padded.shape == (2, 4, 3) and padded.data_ptr() == x.data_ptr()
    assert layout.to_packed(padded).data_ptr() == x.data_ptr()


@pytest.mark.parametrize("lengths", [[], [3, 0]])
def test_empty_inputs_are_refused(lengths):
    with pytest.raises(ValueError):
        PackedLayout(lengths, CPU)


def test_flatten_ids_joins_lists_and_worker_arrays_alike():
    lists = [[101, 7, 102], [101, 102], [5]]
    arrays = [np.asarray(ids, dtype=np.int32) for ids in lists]
    for batch in (lists, arrays):
        flat = flatten_ids(batch)
        assert flat.dtype == np.int64 and flat.tolist() == [101, 7, 102, 101, 102, 5]
    assert flatten_ids([arrays[0], lists[1]]).tolist() == [101, 7, 102, 101, 102]  # mixed
