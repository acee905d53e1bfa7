import torch

from memfit.techniques.activation_offload import ActivationOffload


def test_on_a_cpu_device_the_host_is_the_device_and_nothing_is_counted():
    offload = ActivationOffload(torch.device("cpu"))
    layer = torch.nn.Linear(8, 8)
    with offload.context(enabled=True):
        loss = torch.tanh(layer(torch.randn(4, 8))).sum()
    loss.backward()
    assert layer.weight.grad is not None
    assert offload.live_host_bytes == offload.peak_host_bytes == 0
