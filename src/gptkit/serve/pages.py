"""The keys and values of a server's sequences in pages: what the native step reads (interface.h's
Step) when it decodes many sequences at once.

A page holds ``page_size`` columns (positions) of every layer and head of one sequence. A sequence
joins with the pages its prompt and its longest completion will fill, reserved at once, so that it
never waits for a page once it runs and nothing needs to be evicted; its row of ``block_table``
lists them. Memory is what bounds how many sequences run together: a short request holds a few
pages, not a whole context's worth (a cache with one context-long slot per sequence held 2.4 GB for
16 sequences of GPT-2 small in fp32; here 64 sequences of 100 positions hold 0.5 GB).
"""

from __future__ import annotations

import torch

from gptkit.config import GPTConfig

PAGE_SIZE = 16  # columns a page: small enough that a short request wastes little of its last page


def page_bytes(config: GPTConfig, dtype: torch.dtype, page_size: int = PAGE_SIZE) -> int:
    """The bytes one page of keys and values holds."""
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * config.n_layer * config.d_model * page_size * element


class PagedCache:
    """``pages`` pages of keys and values for at most ``max_sequences`` sequences at once."""

    def __init__(
        self,
        config: GPTConfig,
        pages: int,
        max_sequences: int,
        dtype: torch.dtype,
        page_size: int = PAGE_SIZE,
    ):
        if pages < 1 or max_sequences < 1:
            raise ValueError(f"a paged cache needs pages and rows, got {pages} and {max_sequences}")
        shape = (config.n_layer, pages, config.n_head, page_size, config.head_size)
        # Not zeroed: a column is written before any token reads it, and memory untouched stays
        # unmapped, so the process holds the pages its sequences have used, not the whole budget.
        self.keys = torch.empty(shape, dtype=dtype)
        self.values = torch.empty(shape, dtype=dtype)
        self.page_size, self.pages = page_size, pages
        self.table_width = -(-config.context_length // page_size)
        self.block_table = torch.zeros(max_sequences, self.table_width, dtype=torch.int32)
        self._free_pages = list(range(pages - 1, -1, -1))  # popped from the end: page 0 first
        self._free_rows = list(range(max_sequences - 1, -1, -1))
        self._held: dict[int, list[int]] = {}  # row → its pages

    def pages_for(self, positions: int) -> int:
        return -(-positions // self.page_size)

    def fits(self, positions: int) -> bool:
        """Whether a sequence of up to ``positions`` columns could join now."""
        return bool(self._free_rows) and self.pages_for(positions) <= len(self._free_pages)

    def ever_fits(self, positions: int) -> bool:
        """Whether a sequence of ``positions`` columns fits in an empty cache."""
        return self.pages_for(positions) <= self.pages

    def reserve(self, positions: int) -> int:
        """A row of the block table with the pages for ``positions`` columns (call :meth:`fits` first)."""
        row = self._free_rows.pop()
        pages = [self._free_pages.pop() for _ in range(self.pages_for(positions))]
        self.block_table[row, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        self._held[row] = pages
        return row

    def release(self, row: int) -> None:
        """Give back a row and its pages."""
        self._free_pages.extend(reversed(self._held.pop(row)))
        self._free_rows.append(row)

    @property
    def free_pages(self) -> int:
        return len(self._free_pages)

    @property
    def used_rows(self) -> int:
        return len(self._held)
