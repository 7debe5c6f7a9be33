"""A tripped `Breaker` ends the forward or the backward pass in flight at its next module, and only then."""

from __future__ import annotations

import threading

import pytest
import torch

from models.interrupt import Breaker, Interrupted


def test_a_tripped_breaker_ends_a_forward_and_a_backward_pass_part_way() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    breaker = Breaker()
    breaker.attach(model)
    loss = model(torch.randn(3, 4)).sum()  # not tripped: runs as without hooks
    breaker.trip()
    with pytest.raises(Interrupted):
        loss.backward()  # raised from a parameter's gradient hook, through autograd, as itself
    with pytest.raises(Interrupted, match="the pass in flight was ended part way"):
        model(torch.randn(3, 4))
    breaker.detach()
    assert model(torch.randn(3, 4)).shape == (3, 1)  # detached: no hook left


def test_a_breaker_follows_the_event_it_is_given_and_can_skip_gradients() -> None:
    closing = threading.Event()
    model = torch.nn.Linear(2, 2)
    Breaker(closing).attach(model, gradients=False)
    out = model(torch.ones(1, 2)).sum()
    closing.set()  # an engine's own "closing" event trips it
    out.backward()  # no gradient hooks: a backward runs on
    with pytest.raises(Interrupted):
        model(torch.ones(1, 2))
