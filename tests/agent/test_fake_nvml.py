"""The simulated NVML is a faithful stand-in for pynvml, and backend selection works."""

from __future__ import annotations

import inspect
import types

import pynvml
import pytest

from stormwatch.agent import FakeNvml, NvmlUnavailable
from stormwatch.agent.gpu.backend import NvmlApi, open_backend
from stormwatch.agent.gpu.fake import NVML_FUNCTIONS
from stormwatch.agent.gpu.sim.devices import FakeHandle


def _driver_present() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.parametrize("name", NVML_FUNCTIONS)
def test_fake_functions_have_pynvml_names_and_parameters(name: str) -> None:
    real = inspect.signature(getattr(pynvml, name))
    fake = inspect.signature(getattr(FakeNvml, name))
    assert list(fake.parameters)[1:] == list(real.parameters), name


def test_protocol_functions_all_exist_in_pynvml_and_the_fake() -> None:
    names = [n for n in vars(NvmlApi) if n.startswith("nvml")]
    assert names
    for name in names:
        assert callable(getattr(pynvml, name)) and callable(getattr(FakeNvml, name)), name


@pytest.mark.parametrize("code", sorted(pynvml.NVMLError._valClassMapping))
def test_injected_errors_are_real_pynvml_subclasses(code: int) -> None:
    fake = FakeNvml(2)
    fake.nvmlInit()
    fake.inject_error("nvmlDeviceGetTemperature", code, gpu=1, times=1)
    ok = fake.nvmlDeviceGetTemperature(
        fake.nvmlDeviceGetHandleByIndex(0), pynvml.NVML_TEMPERATURE_GPU
    )
    assert ok > 0
    handle = fake.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(pynvml.NVMLError) as caught:
        fake.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
    assert caught.value.value == code
    assert type(caught.value) is pynvml.NVMLError._valClassMapping[code]
    # times=1: the next call succeeds.
    assert fake.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) > 0


def test_fake_behaves_like_nvml_before_init_and_for_lost_gpus() -> None:
    fake = FakeNvml(2)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    fake.nvmlInit()
    fake.lose_gpu(1)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetHandleByIndex(5)
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    memory = fake.nvmlDeviceGetMemoryInfo(handle)
    assert isinstance(memory, pynvml.c_nvmlMemory_t) and memory.used + memory.free == memory.total
    assert fake.nvmlDeviceGetPciInfo(handle).busId == "00000000:18:00.0"
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetNvLinkUtilizationCounter(handle, 0, 0)
    events = fake.nvmlEventSetCreate()
    fake.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, events)
    with pytest.raises(pynvml.NVMLError_Timeout):
        fake.nvmlEventSetWait(events, 0)
    fake.emit_xid(0, 79)
    data = fake.nvmlEventSetWait(events, 10)
    assert (data.eventType, data.eventData, fake.nvmlDeviceGetIndex(data.device)) == (
        pynvml.nvmlEventTypeXidCriticalError,
        79,
        0,
    )
    fake.nvmlEventSetFree(events)
    fake.nvmlShutdown()


def test_inject_error_rejects_typos() -> None:
    fake = FakeNvml(1)
    with pytest.raises(ValueError, match="unknown NVML function"):
        fake.inject_error("nvmlDeviceGetTemprature", pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(ValueError, match="unknown NVML error code"):
        fake.inject_error("nvmlDeviceGetTemperature", 12345)


def test_auto_backend_uses_the_driver_when_it_answers_else_no_gpu_never_simulated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A node whose driver is broken must not publish healthy simulated H100s (fresh-user
    pass, 2026-12-05: ``agent run`` on this GPU-less machine served DCGM temperatures)."""
    with caplog.at_level("WARNING"), open_backend("auto", sim_gpus=3) as backend:
        if _driver_present():
            assert backend.name == "nvml" and backend.api.nvmlDeviceGetCount() >= 1
        else:
            assert backend.name == "none" and backend.api.nvmlDeviceGetCount() == 0
            assert "exports no GPU metrics" in caplog.text and "--gpu-backend sim" in caplog.text


@pytest.mark.skipif(_driver_present(), reason="an NVIDIA driver is present")
def test_nvml_backend_without_driver_is_a_clear_error() -> None:
    with pytest.raises(NvmlUnavailable, match="--gpu-backend sim"), open_backend("nvml"):
        pass


#: Parameters that name the device a call is about (the GPU an injected error is for).
_DEVICE_PARAMETERS = {"handle", "device", "device1", "index"}


def _call_on(fake: FakeNvml, name: str, gpu: int) -> None:
    """Call ``name`` about GPU ``gpu`` (node-wide calls: without one); other arguments are
    placeholders, since an injected error fires before they are read."""
    arguments = []
    for parameter in inspect.signature(getattr(pynvml, name)).parameters:
        if parameter == "index":
            arguments.append(gpu)
        elif parameter in _DEVICE_PARAMETERS or parameter == "device2":
            arguments.append(FakeHandle(gpu))
        elif parameter == "metricsGet":
            arguments.append(types.SimpleNamespace(sample1=None, sample2=None))
        elif parameter == "fieldIds":
            arguments.append([])
        else:
            arguments.append(0)
    getattr(fake, name)(*arguments)


@pytest.mark.parametrize("name", NVML_FUNCTIONS)
def test_every_nvml_function_fails_with_an_injected_code_for_the_chosen_device_only(name: str):
    code = pynvml.NVML_ERROR_CORRUPTED_INFOROM  # no placeholder argument causes this one
    per_device = bool(_DEVICE_PARAMETERS & set(inspect.signature(getattr(pynvml, name)).parameters))
    fake = FakeNvml(2)
    fake.nvmlInit()
    fake.inject_error(name, code, gpu=1 if per_device else None, times=1)
    calls = fake.calls[name]
    with pytest.raises(pynvml.NVMLError) as caught:
        _call_on(fake, name, 1)
    assert caught.value.value == code
    assert fake.calls[name] == calls + 1
    for gpu in (0, 1) if per_device else (1,):  # the other device, then the same one again
        try:
            _call_on(fake, name, gpu)
        except pynvml.NVMLError as exc:  # a placeholder argument may be refused
            assert exc.value != code, (name, gpu)


def test_fake_mig_answers_like_nvml_for_instances_and_whole_gpu_calls() -> None:
    fake = FakeNvml(2)
    fake.nvmlInit()
    (first,) = fake.set_mig(1, [(1, 9856)])
    plain, parent = fake.nvmlDeviceGetHandleByIndex(0), fake.nvmlDeviceGetHandleByIndex(1)
    disabled = [pynvml.NVML_DEVICE_MIG_DISABLE] * 2
    assert fake.nvmlDeviceGetMigMode(plain) == disabled
    assert fake.nvmlDeviceGetMigMode(parent) == [pynvml.NVML_DEVICE_MIG_ENABLE] * 2
    assert fake.nvmlDeviceGetMaxMigDeviceCount(parent) == 7
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1)  # an empty slot
    mig = fake.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    assert fake.nvmlDeviceGetUUID(mig) == first.uuid != fake.nvmlDeviceGetUUID(parent)
    assert fake.nvmlDeviceGetGpuInstanceId(mig) == first.gpu_instance_id
    assert fake.nvmlDeviceGetAttributes(mig).gpuInstanceSliceCount == 1
    assert fake.nvmlDeviceGetMemoryInfo(mig).total == 9856 * 1024**2
    for whole_gpu_only in (
        lambda: fake.nvmlDeviceGetTemperature(mig, pynvml.NVML_TEMPERATURE_GPU),
        lambda: fake.nvmlDeviceGetUtilizationRates(parent),  # NVML: not in MIG mode
        lambda: fake.nvmlDeviceGetGpuInstanceId(plain),
        lambda: fake.nvmlDeviceGetAttributes(parent),
    ):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            whole_gpu_only()
    fake.inject_error("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_UNKNOWN, gpu=1, times=1)
    with pytest.raises(pynvml.NVMLError_Unknown):  # the parent's injected errors hit instances
        fake.nvmlDeviceGetMemoryInfo(mig)
    fake.lose_gpu(1)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetUUID(mig)
    fake.lose_gpu(1, lost=False)
    fake.set_mig(1, None)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # the instance is gone
        fake.nvmlDeviceGetUUID(mig)
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
