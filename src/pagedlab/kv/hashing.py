"""Stage 4: chained block hashes: a full block is named by its tokens and everything before it.

Builds on: request.py.
Read with: chapters/04-prefix-caching.md.

    hash(block i) = H(hash(block i-1) or NONE_HASH, tokens of block i, extra keys)

Because each hash folds in its parent's, equal hashes mean equal *prefixes*,
not just equal blocks: "the cat" after "ROMEO:" and after "JULIET:" are
different blocks. Only full blocks are hashed; the partly filled last block
of a request is never shared through the cache.

H is SHA-256 over a stable serialization by default. A cache keyed by hashes
returns another request's K/V on a collision, so with untrusted tenants a
weak hash lets one tenant craft prompts that read or poison another's cache;
vLLM switched its default to SHA-256 for that reason. `hash_algo="builtin"`
(Python's hash of a tuple) is faster and fine for a single trusted user.
vLLM: vllm/v1/core/kv_cache_utils.py (hash_block_tokens, NONE_HASH, generate_block_hash_extra_keys).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from pagedlab.request import Request

BlockHash = bytes | int


def make_none_hash(seed: int = 0) -> bytes:
    """The parent hash of every first block; seeded so that separate deployments do not share hashes."""
    return hashlib.sha256(f"pagedlab NONE_HASH {seed}".encode()).digest()


def hash_block_tokens(parent: BlockHash, token_ids: Sequence[int], extra_keys: tuple = (), algo: str = "sha256"):
    """Hash one full block, chained to its parent's hash."""
    key = (parent, tuple(token_ids), extra_keys)
    if algo == "builtin":
        return hash(key)
    return hashlib.sha256(repr(key).encode()).digest()  # repr of ints, bytes and str is stable across runs


def block_extra_keys(request: Request, block_index: int) -> tuple:
    """What besides tokens decides whether K/V can be shared: the tenant's salt, on the first block.

    The salt is folded into block 0 only; the chain carries it to every later block.
    (LoRA adapter names or multimodal inputs would be added here too.)
    """
    if block_index == 0 and request.cache_salt is not None:
        return (("cache_salt", request.cache_salt),)
    return ()


# BEGIN SOLUTION
# TASK block-hashing (25 pts): chained block hashing: hash each newly full block with its parent's hash, once, as tokens
# arrive.
def update_block_hashes(request: Request, block_size: int, none_hash: bytes, algo: str = "sha256") -> None:
    """Hash the request's newly full blocks; earlier ones are never hashed again."""
    hashes = request.block_hashes
    tokens = request.all_token_ids
    for i in range(len(hashes), len(tokens) // block_size):
        parent = hashes[i - 1] if i else none_hash
        chunk = tokens[i * block_size : (i + 1) * block_size]
        hashes.append(hash_block_tokens(parent, chunk, block_extra_keys(request, i), algo))


# END SOLUTION
