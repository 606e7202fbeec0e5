"""The server's prefix cache: how many of a prompt's tokens SGLang's radix cache already holds.

SGLang 0.5.23 keeps every request's tokens (the prompt once prefilled, prompt and output once
finished) in a radix tree over token ids (page size 1), matches each new prompt's longest
prefix against it, and prefills only the rest; least recently used leaves go first when the
KV pool is full. `cached_tokens` in `meta_info` (and `usage.prompt_tokens_details` with
`--enable-cache-report`) is that match's length.

Here the tree is a chain of token blocks keyed by (parent key, the block's tokens), so a match
costs one dict lookup per block, then a token-by-token walk into the next block's children: the
same length a per-token radix tree gives. The prompt's last token is never counted as cached
(SGLang always computes at least one token to get the next token's logits).
"""

from __future__ import annotations

from collections import OrderedDict

BLOCK = 16
_Key = tuple[int, tuple[int, ...]]  # (parent block's id, this block's tokens)


class PrefixCache:
    """Per server; `capacity` tokens of KV (SGLang's max_total_tokens), LRU leaves first."""

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_blocks = max(1, capacity_tokens // BLOCK)
        # key -> block id, in LRU order (oldest first); children of a block id, for the
        # partial match into the next block.
        self._blocks: OrderedDict[_Key, int] = OrderedDict()
        self._children: dict[int, set[tuple[int, ...]]] = {}
        self._next_id = 1  # 0 is the root

    def __len__(self) -> int:
        return len(self._blocks) * BLOCK

    def match(self, ids: list[int]) -> int:
        """Tokens of `ids` held, from its start; touches what matched (most recent)."""
        parent, matched, path = 0, 0, []
        limit = len(ids) - 1  # the last prompt token is always computed
        while matched + BLOCK <= limit:
            key = (parent, tuple(ids[matched : matched + BLOCK]))
            block = self._blocks.get(key)
            if block is None:
                break
            path.append(key)
            parent, matched = block, matched + BLOCK
        for key in reversed(path):  # the leaf first, so a parent is never older than its child
            self._blocks.move_to_end(key)
        rest = ids[matched:limit]
        best = 0
        for child in self._children.get(parent, ()):
            n = 0
            for a, b in zip(child, rest, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        return matched + best

    def insert(self, ids: list[int]) -> None:
        """Hold every whole block of `ids` (a prompt once prefilled, prompt + output at the end)."""
        parent = 0
        path = []
        for at in range(0, len(ids) - BLOCK + 1, BLOCK):
            chunk = tuple(ids[at : at + BLOCK])
            key = (parent, chunk)
            block = self._blocks.get(key)
            if block is None:
                block = self._next_id
                self._next_id += 1
                self._blocks[key] = block
                self._children.setdefault(parent, set()).add(chunk)
            path.append(key)
            parent = block
        for key in reversed(path):
            self._blocks.move_to_end(key)
        while len(self._blocks) > self.capacity_blocks:
            (old_parent, chunk), old = self._blocks.popitem(last=False)
            siblings = self._children.get(old_parent)
            if siblings is not None:
                siblings.discard(chunk)
                if not siblings:
                    del self._children[old_parent]
            # Its descendants can no longer be reached; they age out as the oldest entries.
            self._children.pop(old, None)

    def clear(self) -> None:
        """/flush_cache."""
        self._blocks.clear()
        self._children.clear()
