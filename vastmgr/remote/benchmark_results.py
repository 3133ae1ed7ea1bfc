"""After a benchmark result: record the host's performance (the best rate per Vast machine and
GPU set, as vast-manager's host_perf kept it) and destroy the Vast instance of a failed one.
Both need the Vast API, so they run off the request, on the remote app's loop; the instance
has its answer at once, as vast-manager answered before its destroy finished."""

from asgiref.sync import sync_to_async

from vastmgr.fleet.models import Event, Machine
from vastmgr.instances.models import Instance
from vastmgr.lib.errors import SecretUnavailable, VastError
from vastmgr.remote import ssh_loop as background
from vastmgr.remote import vast
from vastmgr.remote.models import MachinePerf


def after_benchmark(instance_pk: int, rate: float, passed: bool) -> None:
    background.launch("call-home benchmark", lambda: _settle(instance_pk, rate, passed))


async def _settle(instance_pk: int, rate: float, passed: bool) -> None:
    instance = await Instance.objects.select_related("machine").aget(pk=instance_pk)
    machine, vast_id = instance.machine, instance.vast_id
    if machine is not None and machine.vast_instance_id is not None:
        vast_id = machine.vast_instance_id
    if vast_id is None:
        return  # not a Vast instance we can name: nothing to look up or destroy
    try:
        client = await sync_to_async(vast.VastClient.from_settings)(background=True)
        if rate > 0:
            await _record_perf(client, machine, vast_id, rate)
        if not passed:
            if machine is not None and machine.state != Machine.State.KILLED:
                await vast.destroy(client, machine, instance.kill_reason)
            else:
                await client.destroy_instance(vast_id)
    except (VastError, SecretUnavailable) as exc:
        await sync_to_async(instance.note)(
            f"after the benchmark, Vast instance {vast_id} could not be "
            f"{'looked up' if passed else 'destroyed'}: {exc}", level=Event.Level.ERROR)


async def _record_perf(client: vast.VastClient, machine: Machine | None, vast_id: int,
                       rate: float) -> None:
    if machine is not None and machine.gpu_name and machine.vast_machine_id is not None:
        facts = (machine.vast_machine_id, machine.gpu_name, machine.gpu_count)
    else:
        found = await client.instance(vast_id)
        if not found or found.get("machine_id") is None:
            return
        facts = (int(found["machine_id"]), str(found.get("gpu_name") or ""),
                 int(found.get("num_gpus") or 0))
    await sync_to_async(MachinePerf.record)(provider_machine_id=facts[0], gpu_name=facts[1],
                                         gpu_count=facts[2], rate=rate)
