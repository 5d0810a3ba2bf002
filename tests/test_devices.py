"""The device model: CUDA's enumeration order, CUDA_VISIBLE_DEVICES, and device specs."""
import pytest

from gpuctx_jupyter.core.devices import (
    GpuRecord,
    SpecError,
    VisibleDevice,
    cuda_enumeration,
    parse_spec,
    resolve_visibility,
)

GIB = 1024**3
UUID0 = "GPU-bf62cf12-3c4d-4e5f-8a9b-0123456789ab"
UUID1 = "GPU-bf6a0001-aaaa-bbbb-cccc-0123456789ab"  # shares "GPU-bf6" with UUID0


def h200(index, uuid, bus, used=0):
    return GpuRecord(
        nvml_index=index, uuid=uuid, name="NVIDIA H200", pci_bus_id=bus,
        compute_capability=(9, 0), memory_total=140 * GIB, memory_used=used,
    )


TWO = [h200(0, UUID0, "00000000:18:00.0"), h200(1, UUID1, "00000000:2A:00.0")]

# An older, slower GPU at the lower bus id: CUDA's default order puts the H100 first.
A100 = GpuRecord(0, "GPU-a100a100-0000-0000-0000-000000000000", "NVIDIA A100-SXM4-80GB",
                 "00000000:07:00.0", (8, 0), 80 * GIB, 0)
H100 = GpuRecord(1, "GPU-91009100-0000-0000-0000-000000000000", "NVIDIA H100 80GB HBM3",
                 "00000000:B3:00.0", (9, 0), 80 * GIB, 0)
MIXED = [A100, H100]

MIG_PARENT = GpuRecord(0, "GPU-0a0a0a0a-0000-0000-0000-000000000000", "NVIDIA A100-SXM4-40GB",
                       "00000000:07:00.0", (8, 0), 40 * GIB, 0, mig_enabled=True)
MIG_A = GpuRecord(0, "MIG-11111111-aaaa-0000-0000-000000000000", "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
                  "00000000:07:00.0", (8, 0), 20 * GIB, 0, mig_parent=MIG_PARENT.uuid, mig_index=0)
MIG_B = GpuRecord(0, "MIG-22222222-bbbb-0000-0000-000000000000", "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
                  "00000000:07:00.0", (8, 0), 20 * GIB, 0, mig_parent=MIG_PARENT.uuid, mig_index=1)
PLAIN = GpuRecord(1, "GPU-1b1b1b1b-0000-0000-0000-000000000000", "NVIDIA A100-SXM4-40GB",
                  "00000000:0F:00.0", (8, 0), 40 * GIB, 0)
# NVML lists the instances after their parent, in slot order; CUDA puts them in the parent's place.
WITH_MIG = [MIG_PARENT, MIG_B, MIG_A, PLAIN]


def visible(records, **env):
    return resolve_visibility(records, env)


def uuids(vis):
    assert [d.ordinal for d in vis.devices] == list(range(len(vis.devices)))
    return [d.record.uuid for d in vis.devices]


# --- CUDA's enumeration order -------------------------------------------------------------------

def test_memory_free():
    assert h200(0, UUID0, "", used=40 * GIB).memory_free == 100 * GIB
    assert GpuRecord(0, UUID0, "x", memory_total=GIB).memory_free is None


def test_default_order_is_fastest_first_and_pci_order_is_bus_order():
    assert cuda_enumeration(MIXED, "FASTEST_FIRST") == [H100, A100]
    assert cuda_enumeration(MIXED, "PCI_BUS_ID") == [A100, H100]


def test_identical_gpus_enumerate_in_bus_order_either_way():
    reversed_nvml = list(reversed(TWO))
    assert cuda_enumeration(reversed_nvml, "FASTEST_FIRST") == TWO
    assert cuda_enumeration(reversed_nvml, "PCI_BUS_ID") == TWO


def test_missing_bus_id_falls_back_to_nvml_index_and_unknown_capability_sorts_last():
    a, b = GpuRecord(1, "GPU-b", "x"), GpuRecord(0, "GPU-a", "x")
    assert cuda_enumeration([a, b], "PCI_BUS_ID") == [b, a]
    lost = GpuRecord(0, "", "", error="NVML error: GPU is lost")
    assert cuda_enumeration([lost, H100], "FASTEST_FIRST") == [H100, lost]


def test_cuda_enumeration_rejects_an_unknown_order():
    with pytest.raises(ValueError):
        cuda_enumeration(TWO, "SLOWEST_FIRST")


def test_mig_instances_replace_their_parent_in_slot_order():
    assert cuda_enumeration(WITH_MIG, "PCI_BUS_ID") == [MIG_A, MIG_B, PLAIN]


# --- CUDA_DEVICE_ORDER and CUDA_VISIBLE_DEVICES ---------------------------------------------------

def test_unset_shows_everything_in_enumeration_order():
    vis = visible(TWO)
    assert uuids(vis) == [UUID0, UUID1]
    assert vis.cuda_visible_devices is None
    assert vis.device_order == "FASTEST_FIRST"
    assert vis.notes == ()
    assert vis.empty_reason is None


def test_empty_string_hides_everything():
    vis = visible(TWO, CUDA_VISIBLE_DEVICES="")
    assert vis.devices == ()
    assert vis.empty_reason == "CUDA_VISIBLE_DEVICES is set to an empty string, which hides every GPU"


def test_blank_string_hides_everything():
    vis = visible(TWO, CUDA_VISIBLE_DEVICES=" ")
    assert vis.devices == ()
    assert "hides every GPU" in vis.empty_reason and "' '" in vis.empty_reason


def test_reorder():
    vis = visible(TWO, CUDA_VISIBLE_DEVICES="1,0")
    assert uuids(vis) == [UUID1, UUID0]
    assert vis.notes == ()


def test_spaces_around_entries_are_ignored():
    assert uuids(visible(TWO, CUDA_VISIBLE_DEVICES=" 1 , 0 ")) == [UUID1, UUID0]


def test_full_uuid():
    assert uuids(visible(TWO, CUDA_VISIBLE_DEVICES=UUID1)) == [UUID1]


def test_uuid_prefix_matches_hex_digits_in_any_case_and_ignores_dashes():
    for entry in ("GPU-bf62cf", "GPU-BF62CF", "GPU-bf-62-cf", "GPU-bf62cf123c4d4e5f8a9b0123456789ab",
                  UUID0 + "/0/0", "MIG-bf62cf"):
        vis = visible(TWO, CUDA_VISIBLE_DEVICES=entry)
        assert uuids(vis) == [UUID0], entry
        assert vis.notes == ()


@pytest.mark.parametrize(("entry", "problem"), [
    ("gpu-bf62cf", "is not a device: neither an index nor a GPU-/MIG- UUID"),
    ("GPU-bf62cx", "has 'x' where CUDA expects a hex digit of a UUID"),
    ("GPU-bf62cf ", "has ' ' where CUDA expects a hex digit of a UUID"),
    ("GPU-", "matches no device UUID that CUDA can use"),
])
def test_uuid_entries_cuda_rejects(entry, problem):
    vis = visible(TWO, CUDA_VISIBLE_DEVICES=entry)
    assert vis.devices == ()
    assert vis.empty_reason == (f"CUDA_VISIBLE_DEVICES entry {entry!r} {problem}: "
                                "CUDA ignores it and every entry after it, which leaves no GPU")


def test_ambiguous_prefix_truncates_with_a_note():
    vis = visible(TWO, CUDA_VISIBLE_DEVICES="GPU-bf6a,GPU-bf6,GPU-bf62")
    assert uuids(vis) == [UUID1]
    assert vis.notes == ("CUDA_VISIBLE_DEVICES entry 'GPU-bf6' is ambiguous: it is a prefix of 2 "
                         "device UUIDs: CUDA ignores it and every entry after it",)


def test_out_of_range_index_truncates_there():
    vis = visible(TWO, CUDA_VISIBLE_DEVICES="0,7,1")
    assert uuids(vis) == [UUID0]
    assert vis.notes == ("CUDA_VISIBLE_DEVICES entry '7' is out of range: CUDA sees 2 devices (0-1): "
                         "CUDA ignores it and every entry after it",)


@pytest.mark.parametrize("value", ["0,0", "1,0,1", "GPU-bf6a,GPU-bf62,GPU-bf6a0001"])
def test_a_repeat_makes_cuda_fail_to_start(value):
    vis = visible(TWO, CUDA_VISIBLE_DEVICES=value)
    assert vis.devices == ()
    assert "twice, so CUDA fails to start (CUDA_ERROR_INVALID_DEVICE): list each GPU once" in vis.notes[-1]
    assert vis.empty_reason == vis.notes[-1]


def test_a_repeat_after_the_truncation_does_not_count():
    vis = visible(TWO, CUDA_VISIBLE_DEVICES="0,x,0")
    assert uuids(vis) == [UUID0]
    assert "'x' is not a device" in vis.notes[0]


def test_indices_and_uuids_do_not_mix():
    by_index = visible(TWO, CUDA_VISIBLE_DEVICES="1,GPU-bf62,0")
    assert uuids(by_index) == [UUID1]
    assert by_index.notes == ("CUDA_VISIBLE_DEVICES entry 'GPU-bf62' is a UUID in a list of indices, "
                              "which CUDA does not allow: CUDA ignores it and every entry after it",)
    by_uuid = visible(TWO, CUDA_VISIBLE_DEVICES="GPU-bf6a,0")
    assert uuids(by_uuid) == [UUID1]
    assert "'0' is an index in a list of UUIDs" in by_uuid.notes[0]


@pytest.mark.parametrize(("value", "ordinals"), [
    ("1x", [1]), ("0x1", [0]), ("1.5,0", [1, 0]), ("+1", [1]), ("-0", [0]), ("1 0", [1]),
])
def test_index_entries_are_read_like_strtoul(value, ordinals):
    vis = visible(TWO, CUDA_VISIBLE_DEVICES=value)
    assert uuids(vis) == [TWO[i].uuid for i in ordinals]
    first = value.split(",")[0]
    assert vis.notes[0] == (f"CUDA_VISIBLE_DEVICES entry {first!r} counts as {ordinals[0]}: "
                            "CUDA reads its leading digits only")


@pytest.mark.parametrize("value", ["-1", "x7", "", "GPU-ffff", "cuda:0"])
def test_invalid_first_entry_hides_everything(value):
    vis = visible(TWO, CUDA_VISIBLE_DEVICES=f"{value},1")
    assert vis.devices == ()
    assert vis.notes[-1].startswith(f"CUDA_VISIBLE_DEVICES entry {value!r} ")
    assert vis.empty_reason.endswith("CUDA ignores it and every entry after it, which leaves no GPU")


def test_negative_index_is_named_as_such():
    vis = visible(TWO, CUDA_VISIBLE_DEVICES="-1")
    assert vis.empty_reason == ("CUDA_VISIBLE_DEVICES entry '-1' is a negative index: "
                                "CUDA ignores it and every entry after it, which leaves no GPU")


def test_garbage_after_valid_entries_keeps_those_before():
    vis = visible(TWO, CUDA_VISIBLE_DEVICES="1,x7,0")
    assert uuids(vis) == [UUID1]
    assert vis.notes == ("CUDA_VISIBLE_DEVICES entry 'x7' is not a device: neither an index nor a "
                         "GPU-/MIG- UUID: CUDA ignores it and every entry after it",)


def test_mig_instance_by_uuid_and_by_index():
    assert uuids(visible(WITH_MIG, CUDA_VISIBLE_DEVICES="MIG-22222222")) == [MIG_B.uuid]
    assert uuids(visible(WITH_MIG, CUDA_VISIBLE_DEVICES=MIG_A.uuid.upper())) == [MIG_A.uuid]
    assert uuids(visible(WITH_MIG, CUDA_VISIBLE_DEVICES="2,1")) == [PLAIN.uuid, MIG_B.uuid]
    assert uuids(visible(WITH_MIG)) == [MIG_A.uuid, MIG_B.uuid, PLAIN.uuid]


def test_mig_parent_uuid_is_not_a_cuda_device():
    vis = visible(WITH_MIG, CUDA_VISIBLE_DEVICES=MIG_PARENT.uuid)
    assert vis.devices == ()
    assert "matches no device UUID" in vis.notes[0]


def test_legacy_mig_form_is_unsupported():
    vis = visible(WITH_MIG, CUDA_VISIBLE_DEVICES=f"2,MIG-{MIG_PARENT.uuid}/1/0")
    assert uuids(vis) == [PLAIN.uuid]
    assert "legacy MIG-GPU-<uuid>/<gi>/<ci>" in vis.notes[0]


def test_mig_mode_without_instances_is_explained():
    vis = visible([MIG_PARENT, PLAIN])
    assert uuids(vis) == [PLAIN.uuid]
    assert vis.notes == ("GPU 0 (NVIDIA A100-SXM4-40GB) is in MIG mode with no MIG instance: "
                         "CUDA cannot use it until one is created",)


def test_device_order_changes_what_index_0_means():
    default = visible(MIXED, CUDA_VISIBLE_DEVICES="0")
    by_bus = visible(MIXED, CUDA_VISIBLE_DEVICES="0", CUDA_DEVICE_ORDER="PCI_BUS_ID")
    assert uuids(default) == [H100.uuid]
    assert uuids(by_bus) == [A100.uuid]
    assert by_bus.device_order == "PCI_BUS_ID" and by_bus.notes == ()
    assert any("CUDA_DEVICE_ORDER=PCI_BUS_ID" in note for note in default.notes)
    assert uuids(visible(MIXED)) == [H100.uuid, A100.uuid]
    assert uuids(visible(MIXED, CUDA_DEVICE_ORDER="PCI_BUS_ID")) == [A100.uuid, H100.uuid]


@pytest.mark.parametrize("order", ["pci_bus_id", "Fastest_First", "BOGUS", "", " PCI_BUS_ID"])
def test_device_order_must_be_spelled_exactly(order):
    vis = visible(TWO, CUDA_DEVICE_ORDER=order, CUDA_VISIBLE_DEVICES="0")
    assert vis.devices == ()
    assert vis.empty_reason == (
        f"CUDA_DEVICE_ORDER={order!r} is neither FASTEST_FIRST nor PCI_BUS_ID (spelled exactly so), "
        "so CUDA fails to start (CUDA_ERROR_INVALID_DEVICE): fix or unset it"
    )
    assert visible(TWO, CUDA_DEVICE_ORDER="FASTEST_FIRST").device_order == "FASTEST_FIRST"


def test_no_gpu_at_all():
    vis = visible([])
    assert vis.devices == () and vis.notes == ()
    assert vis.empty_reason == "no GPU that CUDA can use was found on this machine"


# --- device specs ---------------------------------------------------------------------------------

DEVICES = visible(TWO).devices


@pytest.mark.parametrize(
    ("spec", "ordinal"),
    [("1", 1), ("0", 0), (" 1 ", 1), ("cuda:1", 1), ("CUDA:0", 0), ("cuda", 0), ("Cuda", 0),
     (UUID1, 1), ("GPU-bf62cf", 0), ("gpu-BF6A", 1), (UUID0.lower(), 0)],
)
def test_spec_forms(spec, ordinal):
    assert parse_spec(spec, DEVICES).ordinal == ordinal


def test_spec_ordinal_follows_visibility_not_nvml():
    devices = visible(TWO, CUDA_VISIBLE_DEVICES="1,0").devices
    assert parse_spec("0", devices).record.uuid == UUID1


def test_spec_name_fragment():
    devices = visible(MIXED).devices
    assert parse_spec("a100", devices).record is A100
    assert parse_spec(" H100 ", devices).record is H100
    assert parse_spec("hbm3", devices).ordinal == 0


def test_spec_mig_uuid():
    devices = visible(WITH_MIG).devices
    assert parse_spec("mig-2222", devices).record is MIG_B
    with pytest.raises(SpecError, match=r"'3g.20gb' matches 2 GPUs \(0, 1\)"):
        parse_spec("3g.20gb", devices)


def test_auto_picks_most_free_memory():
    devices = visible([h200(0, UUID0, "00000000:18:00.0", used=50 * GIB),
                       h200(1, UUID1, "00000000:2A:00.0", used=10 * GIB)]).devices
    assert parse_spec("auto", devices).ordinal == 1
    assert parse_spec(" AUTO ", devices).ordinal == 1


def test_auto_ties_go_to_the_lowest_ordinal():
    devices = visible(TWO, CUDA_VISIBLE_DEVICES="1,0").devices
    assert parse_spec("auto", devices).ordinal == 0


def test_auto_ranks_unknown_memory_last():
    unknown = GpuRecord(0, UUID0, "NVIDIA H200", error="NVML error: GPU is lost")
    known = h200(1, UUID1, "", used=139 * GIB)
    devices = (VisibleDevice(0, unknown), VisibleDevice(1, known))
    assert parse_spec("auto", devices).ordinal == 1
    assert parse_spec("auto", (VisibleDevice(0, unknown),)).ordinal == 0


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("3", "GPU 3 is not visible: this kernel sees GPUs 0-1 (use one of those ordinals, or `%gpu list`)"),
        ("cuda:2", "GPU 2 is not visible: this kernel sees GPUs 0-1 (use one of those ordinals, or `%gpu list`)"),
        ("h100", "'h100' matches no visible GPU (visible: 0 NVIDIA H200, 1 NVIDIA H200)"),
        ("nvidia", "'nvidia' matches 2 GPUs (0, 1): give an ordinal or a UUID"),
        ("GPU-bf6", "'GPU-bf6' matches 2 GPUs (0, 1): give a longer UUID prefix or an ordinal"),
        ("GPU-0000", f"'GPU-0000' matches no visible GPU (visible: 0 {UUID0}, 1 {UUID1})"),
        ("-1", "'-1' is not a device spec: use an ordinal like 1, cuda:1, a GPU UUID, a name fragment or auto"),
        ("cuda:x", "'cuda:x' is not a device spec: use an ordinal like 1, cuda:1, a GPU UUID, a name fragment or auto"),
        ("cuda:-1", "'cuda:-1' is not a device spec: use an ordinal like 1, cuda:1, a GPU UUID, a name fragment or auto"),
        ("", "'' is not a device spec: use an ordinal like 1, cuda:1, a GPU UUID, a name fragment or auto"),
    ],
)
def test_spec_errors_say_what_to_do(spec, message):
    with pytest.raises(SpecError) as raised:
        parse_spec(spec, DEVICES)
    assert str(raised.value) == message
    assert "\n" not in message


def test_spec_error_for_a_single_visible_gpu():
    devices = visible(TWO, CUDA_VISIBLE_DEVICES="1").devices
    with pytest.raises(SpecError, match=r"^GPU 1 is not visible: this kernel sees GPU 0 "):
        parse_spec("1", devices)


def test_spec_with_nothing_visible():
    with pytest.raises(SpecError, match="^no GPU is visible$"):
        parse_spec("auto", ())


def test_spec_error_is_a_value_error():
    assert issubclass(SpecError, ValueError)
