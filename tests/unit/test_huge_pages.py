"""engine.huge_pages: where the arena puts tensors (the huge pages themselves are the kernel's
choice, measured by `bench.models --sizes`, not asserted here)."""
from __future__ import annotations

import torch

from engine.huge_pages import HugePageArena, huge_page_empty


def test_a_huge_page_tensor_is_writable_memory_of_its_shape() -> None:
    tensor = huge_page_empty((3, 5), torch.float32)
    assert tensor.shape == (3, 5) and tensor.dtype == torch.float32 and tensor.is_contiguous()
    tensor.copy_(torch.arange(15, dtype=torch.float32).view(3, 5))
    assert tensor.sum().item() == 105


def test_the_arena_packs_small_tensors_64_byte_aligned_in_one_chunk() -> None:
    arena = HugePageArena(chunk_bytes=4096)
    a, b, c = arena.empty((10, 10)), arena.empty((3, 7)), arena.empty((2, 4), torch.float32)
    base = a.data_ptr()
    assert (b.data_ptr() - base, c.data_ptr() - base) == (128, 192)
    a.fill_(1), b.fill_(2), c.fill_(3.0)
    assert a.sum().item() == 100 and b.sum().item() == 42 and c.sum().item() == 24.0


def test_a_full_chunk_starts_another_and_a_large_tensor_gets_its_own_mapping() -> None:
    arena = HugePageArena(chunk_bytes=4096)
    first = arena.empty((1000,))
    second = arena.empty((1000,))
    third = arena.empty((1000,))            # 3 x 1024 bytes used of 4096
    fourth = arena.empty((1000,))
    fifth = arena.empty((1000,))            # does not fit: a new chunk
    assert [t.data_ptr() - first.data_ptr() for t in (second, third, fourth)] == [1024, 2048, 3072]
    assert not first.data_ptr() <= fifth.data_ptr() < first.data_ptr() + 4096
    large = arena.empty((2000,))            # more than a quarter of a chunk
    after = arena.empty((10,))
    assert after.data_ptr() - fifth.data_ptr() == 1024
    assert not fifth.data_ptr() <= large.data_ptr() < fifth.data_ptr() + 4096
