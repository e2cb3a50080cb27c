"""Cache digests (docs/FORMAT.md, "Cache residency") through the Python
binding: written by the Rust publisher (`Publisher.publish_cache`), read back
by `Reader.read_cache` from the files under `<dir>.cache/`."""

import pathlib

import pytest

from engine_state import Publisher, Reader, block_hashes

# Two prompts sharing their first 512-token block: 3 distinct router blocks.
SHARED = [7] * 512
PROMPT_A = SHARED + [1] * 512
PROMPT_B = SHARED + [2] * 512


def digest_blocks():
    return sorted(set(block_hashes(PROMPT_A) + block_hashes(PROMPT_B)))


def cache_file(state_dir: pathlib.Path, engine_id: str) -> pathlib.Path:
    return state_dir.with_name(state_dir.name + ".cache") / engine_id


def test_a_published_digest_is_read_back_ascending(uri, state_dir):
    blocks = digest_blocks()
    assert len(blocks) == 3
    with Publisher(uri=uri, engine_id="e0") as pub:
        assert pub.publish_cache(list(reversed(blocks)), 3, 8) is True
        pub.publish(num_running=1)
        assert cache_file(state_dir, "e0").is_file(), "the digest lives beside the state directory"
        reader = Reader(uri=uri, cache_digests=True)
        (state,) = reader.read()
        assert (state.cache_blocks, state.cache_version) == (3, 1)
        assert reader.read_cache("e0") == blocks
        assert reader.errors == []

        # The same set (any order) is no new version; another set is.
        assert pub.publish_cache(blocks, 3, 8) is False
        assert pub.publish_cache(blocks[:1], 1, 8) is True
        pub.publish(num_running=1)
        (state,) = reader.read()
        assert (state.cache_blocks, state.cache_version) == (1, 2)
        assert reader.read_cache("e0") == blocks[:1]

        # A router's question: how many leading blocks of a prompt are held.
        held = set(reader.read_cache("e0"))
        prompt = block_hashes(PROMPT_A + [3] * 100)
        assert [h in held for h in prompt] == [True, False]


def test_no_digest_and_unknown_engines_are_none(uri):
    with Publisher(uri=uri, engine_id="plain") as pub:
        pub.publish(num_running=1)
        reader = Reader(uri=uri, cache_digests=True)
        (state,) = reader.read()
        assert state.cache_version == 0
        assert reader.read_cache("plain") is None
        assert reader.read_cache("nobody") is None


def test_a_digest_is_used_only_while_its_engine_is_fresh(uri):
    with Publisher(uri=uri, engine_id="e0") as pub:
        pub.publish_cache(digest_blocks(), 3, 8)
        pub.publish(num_running=1)
        reader = Reader(uri=uri, cache_digests=True)
        reader.read()
        assert reader.read_cache("e0") == digest_blocks()
    # Closed: the engine is dead (or gone) at the next read, its digest unused.
    assert [s.status for s in reader.read()] in ([], ["dead"])
    assert reader.read_cache("e0") is None


def test_read_cache_needs_cache_digests(uri):
    with Publisher(uri=uri, engine_id="e0") as pub:
        pub.publish_cache(digest_blocks(), 3, 8)
        pub.publish(num_running=1)
        reader = Reader(uri=uri)
        (state,) = reader.read()
        assert state.cache_version == 1, "the snapshot names the digest either way"
        with pytest.raises(ValueError, match="cache_digests=True"):
            reader.read_cache("e0")


def test_a_corrupt_digest_is_that_engines_error_only(uri, state_dir):
    blocks = digest_blocks()
    with Publisher(uri=uri, engine_id="e0") as pub:
        pub.publish_cache(blocks, 3, 8)
        pub.publish(num_running=2)
        # Another process writes the entries out of order (the seqlock
        # sequence stays even, so the copy is consistent but invalid).
        path = cache_file(state_dir, "e0")
        data = bytearray(path.read_bytes())
        data[128:136], data[136:144] = data[136:144], data[128:136]
        with open(path, "r+b") as f:
            f.write(data)
        reader = Reader(uri=uri, cache_digests=True)
        (state,) = reader.read()
        assert (state.status, state.num_running) == ("fresh", 2), "the state is still read"
        assert reader.read_cache("e0") is None
        (error,) = reader.errors
        assert "e0" in error and "ascending" in error, error


def test_bad_digests_are_refused_before_anything_is_written(uri):
    with Publisher(uri=uri, engine_id="e0") as pub:
        with pytest.raises(ValueError, match="capacity"):
            pub.publish_cache([1, 2, 3], 3, 2)
        with pytest.raises(ValueError, match="held"):
            pub.publish_cache([1, 2], 1, 4)
        with pytest.raises(OverflowError):
            pub.publish_cache([-1], 1, 4)
        pub.publish(num_running=1)
        (state,) = Reader(uri=uri).read()
        assert (state.cache_blocks, state.cache_version) == (0, 0)
