"""A tqdm progress bar showing loss, lr, throughput and memory per optimizer step."""

from __future__ import annotations

from typing import Any

from memfit._utils.sizes import format_bytes


class ProgressBar:
    def __init__(self, total: int, initial: int, enabled: bool):
        self._bar = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)

    def update(self, record: dict[str, Any]) -> None:
        if self._bar is None:
            return
        rate = ("tok/s", "tokens_per_second") if "tokens" in record else \
            ("ex/s", "examples_per_second")
        postfix = {"loss": f"{record['loss']:.4f}", "lr": f"{record['lr']:.2e}",
                   rate[0]: f"{record[rate[1]]:.0f}"}
        if "memory_peak_bytes" in record:
            postfix["mem"] = format_bytes(record["memory_peak_bytes"])
        self._bar.set_postfix(postfix, refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
