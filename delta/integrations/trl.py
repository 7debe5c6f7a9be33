"""TRL AsyncGRPO's `weight_transfer=` over a bucket: the trainer publishes, any number of servers follow.

    from delta.integrations.trl import BucketWeightTransfer

    trainer = AsyncGRPOTrainer(..., weight_transfer=BucketWeightTransfer("s3://bucket/run"))

and beside each `vllm serve ... --weight-transfer-config '{"backend":"delta"}'`:

    python -m delta follow --bucket s3://bucket/run --vllm-url http://127.0.0.1:8000

Implements TRL 1.16's `WeightTransferProtocol`; `pause` and `resume` do nothing (servers pause themselves, each for
its own apply). Imports no TRL. A LoRA run publishes the merged weights (`dtype=torch.bfloat16`) or the adapter
alone (`adapter_of=model`); see `wire.lora`."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..bucket.publish import Publisher, PublisherConfig
from ..storage import Storage

__all__ = ["BucketWeightTransfer"]


def _adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The active adapter's tensors of a PEFT model under PEFT's saved names, sharing the model's storage.

    Raises:
        ValueError: the model is not a PEFT model, or its adapter holds no tensor.
    """
    from peft import PeftModel, get_peft_model_state_dict

    if not isinstance(model, PeftModel):
        raise ValueError(f"adapter_of is a {type(model).__name__}, not a PEFT model (peft.get_peft_model wraps one)")
    state = get_peft_model_state_dict(model, adapter_name=model.active_adapters[0])
    if not state:
        raise ValueError("the PEFT model's adapter holds no tensor: its target modules matched none of the model's")
    return {name: tensor.detach() for name, tensor in state.items()}


class BucketWeightTransfer:
    """Publishes the weights AsyncGRPO streams after each optimizer step as the bucket's next version.

    Args:
        bucket: A `delta.Bucket`, a `Storage` or a URL.
        config: Publisher settings (anchor interval, codec, retention).
        dtype: The published dtype (e.g. `torch.bfloat16` while training in fp32); None keeps each tensor's own.
        wait: Block in `send_weights` until the version is committed (default: in the background, coalescing).
        adapter_of: A PEFT model whose active adapter alone is published (LoRA's adapter mode) in place of the
            streamed weights, which are still read to their end. None: what is streamed (merged, for PEFT).

    The published state is one copy on the CPU, so the trainer's tensors may change once `send_weights` returns.
    Parameters AsyncGRPO does not stream (frozen ones, a tied lm_head) are not published. Call every method from
    the trainer's main process.
    """

    def __init__(
        self,
        bucket: str | Storage,
        config: PublisherConfig | None = None,
        *,
        dtype: torch.dtype | None = None,
        wait: bool = False,
        adapter_of: torch.nn.Module | None = None,
    ) -> None:
        self.bucket = bucket
        self.config = config or PublisherConfig()
        self.dtype = dtype
        self.wait = wait
        self.adapter_of = adapter_of
        self.publisher: Publisher | None = None
        self._state: dict[str, torch.Tensor] = {}

    @property
    def version(self) -> int | None:
        """The newest version committed to the bucket by this transfer's publisher (or resumed from)."""
        return None if self.publisher is None or self.publisher.last is None else self.publisher.last.version

    def init_weight_transfer(self) -> None:
        """Open the publisher (reads the bucket's manifest: numbering continues after its newest version)."""
        if self.publisher is None:
            self.publisher = Publisher(self.bucket, self.config)

    def pause(self) -> None:
        """Nothing to pause: publishing does not stop any server."""

    def send_weights(self, iterator: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Cast each streamed `(name, tensor)` into the published state, then publish it as a version.

        Raises:
            ValueError: a name or shape other than the first call's.
            PublishError: publishing stopped on an error in the background.
        """
        self.init_weight_transfer()
        assert self.publisher is not None  # made by init_weight_transfer
        if self.adapter_of is not None:
            for _ in iterator:  # drained: its tensors are not published, but other ranks may gather with it
                pass
            iterator = iter(_adapter_state(self.adapter_of).items())
        first = not self._state
        seen = set()
        for name, tensor in iterator:
            tensor = tensor.detach()
            if first:
                self._state[name] = tensor.to("cpu", self.dtype or tensor.dtype, copy=True).contiguous()
            else:
                buffer = self._state.get(name)
                if buffer is None or buffer.shape != tensor.shape:
                    raise ValueError(
                        f"send_weights streamed {name!r} {tuple(tensor.shape)}, which the published "
                        "state does not hold in that shape; every call must stream the same tensors "
                        "(start a new bucket for another model)"
                    )
                buffer.copy_(tensor)
            seen.add(name)
        if not first and seen != set(self._state):
            raise ValueError(
                f"send_weights did not stream {sorted(set(self._state) - seen)[:5]}; every call must "
                "stream the same tensors"
            )
        self.publisher.publish(self._state)
        if self.wait:
            self.publisher.flush()

    def resume(self) -> None:
        """Nothing to resume (see `pause`)."""

    def destroy(self) -> None:
        """Wait until the last version is committed, then stop the publisher."""
        if self.publisher is not None:
            self.publisher.close()
            self.publisher = None
