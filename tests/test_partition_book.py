"""The partition book's id maps, without any files or processes."""

from __future__ import annotations

import numpy as np
import pytest

from partition.book import PartitionBook

# Seven nodes; partition 1 is empty.  Original ids 0..6 go to partitions 2,0,2,2,0,0,2.
PARTS = np.array([2, 0, 2, 2, 0, 0, 2])


@pytest.fixture
def book() -> PartitionBook:
    return PartitionBook.from_parts(PARTS, 3)[0]


def test_relabelling_is_contiguous_and_keeps_original_order(book: PartitionBook) -> None:
    assert book.num_parts == 3 and book.num_nodes == 7
    assert [book.node_range(p) for p in range(3)] == [(0, 3), (3, 3), (3, 7)]
    np.testing.assert_array_equal(book.orig_ids(0), [1, 4, 5])
    np.testing.assert_array_equal(book.orig_ids(2), [0, 2, 3, 6])
    np.testing.assert_array_equal(book.from_original(np.arange(7)), [3, 0, 4, 5, 1, 2, 6])


def test_maps_invert_each_other(book: PartitionBook) -> None:
    ids = np.arange(7)
    np.testing.assert_array_equal(book.to_original(book.from_original(ids)), ids)
    np.testing.assert_array_equal(book.from_original(book.to_original(ids)), ids)
    np.testing.assert_array_equal(book.partition_of(book.from_original(ids)), PARTS)
    np.testing.assert_array_equal(book.to_global(book.partition_of(ids), book.to_local(ids)), ids)


def test_vectorised_shapes_and_scalars(book: PartitionBook) -> None:
    ids = np.array([[6, 0], [3, 2]])
    assert book.partition_of(ids).shape == (2, 2)
    np.testing.assert_array_equal(book.to_local(ids), [[3, 0], [0, 2]])
    np.testing.assert_array_equal(book.to_local(np.array([3, 6]), part=2), [0, 3])
    assert int(book.to_global(2, 1)) == 4 and int(book.partition_of(5)) == 2
    assert book.to_original([]).shape == (0,) and book.from_original(np.zeros(0, np.int32)).dtype == np.int64


def test_bad_ids_and_partitions_raise(book: PartitionBook) -> None:
    with pytest.raises(ValueError, match=r"new global id 7 is out of range \[0, 7\)"):
        book.partition_of([1, 7])
    with pytest.raises(ValueError, match=r"original id -1 is out of range \[0, 7\)"):
        book.from_original(-1)
    with pytest.raises(TypeError, match=r"new global ids must be integers, got dtype float64"):
        book.to_original(np.array([1.0]))
    with pytest.raises(ValueError, match=r"new global id 1 is not owned by partition 2, which owns \[3, 7\)"):
        book.to_local([4, 1], part=2)
    with pytest.raises(ValueError, match=r"partition 3 out of range \[0, 3\)"):
        book.node_range(3)
    with pytest.raises(ValueError, match=r"local id 0 out of range for partition 1"):
        book.to_global(1, 0)  # partition 1 owns nothing
    with pytest.raises(ValueError, match=r"partition -1 out of range"):
        book.to_global(-1, 0)


def test_orig_ids_of_a_partition_are_opened_once_and_lazily() -> None:
    opened = []
    new2orig = np.array([1, 4, 5, 0, 2, 3, 6])
    offsets = np.array([0, 3, 3, 7])

    def open_part(p: int) -> np.ndarray:
        opened.append(p)
        return new2orig[offsets[p]:offsets[p + 1]]

    book = PartitionBook(offsets=offsets, orig2new=np.argsort(new2orig), orig_ids=open_part)
    assert opened == []
    book.to_original([4, 5])
    book.to_original([6])
    assert opened == [2]
