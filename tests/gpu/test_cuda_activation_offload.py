"""Activation offload on CUDA: saved tensors move to pinned host memory, gradients are
unchanged and the host bytes are counted. Skipped without CUDA."""

import pytest
import torch

from memfit.techniques.activation_offload import ActivationOffload

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_offloaded_backward_matches_and_counts_host_bytes():
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 64).cuda()
    inputs = torch.randn(32, 64, device="cuda")
    torch.tanh(layer(inputs)).sum().backward()
    expected = layer.weight.grad.clone()
    layer.weight.grad = None

    offload = ActivationOffload(torch.device("cuda"))
    with offload.context(enabled=True):
        output = torch.tanh(layer(inputs)).sum()
    assert offload.live_host_bytes > 0
    output.backward()
    torch.testing.assert_close(layer.weight.grad, expected)
    assert offload.peak_host_bytes >= inputs.nbytes
