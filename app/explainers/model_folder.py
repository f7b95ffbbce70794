"""Sections of the model-folder page: the files the engine loaded, what the weights hold, read and copy times."""
from __future__ import annotations

import streamlit as st

from app.ui.format import fmt_bytes
from app.ui.format import MEASURED
from engine.projection.card import weight_bytes
from engine.errors import EngineError
from engine.models.folder import PCIE, FolderReport, pcie_seconds
from engine.service.client import ModelClient
from engine.projection.specs import MODEL_PRESETS

READ = "folder.read"
TARGET = "llama-3.1-8b"


@st.cache_data(show_spinner=False, max_entries=4)
def folder_report(_lm: ModelClient, where: str) -> dict:
    """The folder as it is on the model server's disk, and its config.json (read there)."""
    return _lm.quick("folder.report")


def files_section(lm: ModelClient) -> FolderReport | None:
    try:
        read = folder_report(lm, f"{getattr(lm, 'url', 'local')}:{lm.source}")
    except EngineError as err:
        st.error(f"The model folder cannot be read: {err}")
        return None
    report = read["report"]
    st.caption(f"{MEASURED}: the folder {lm.label} was loaded from, as it is on disk.")
    st.table({"file": [f.name for f in report.files], "what": [f.kind for f in report.files],
              "size": [fmt_bytes(f.size) for f in report.files]})
    st.table({"weight file": [s.name for s in report.shards], "tensors": [f"{s.tensors:,}" for s in report.shards],
              "parameters": [f"{s.parameters:,}" for s in report.shards],
              "stored as": [", ".join(f"{k} ({v:,})" for k, v in s.dtypes.items()) for s in report.shards]})
    st.markdown(f"{len(report.files)} files, {fmt_bytes(report.total_bytes)}; the weights are "
                f"{fmt_bytes(report.weight_bytes)} ({report.weight_bytes / report.total_bytes:.1%}) holding "
                f"{report.parameters:,} parameters. The config says how to build the model; the tokenizer how to turn "
                "text into ids; the safetensors files are a small JSON header (names, dtypes, shapes, offsets) "
                "followed by the raw numbers, so a loader can map them straight into memory without running code.")
    with st.expander("config.json, as the engine read it"):
        st.json(read["config"])
    return report


def measure_read(lm: ModelClient) -> None:
    """Every weight file read once where the model is, timed there."""
    try:
        with st.spinner("Reading every weight byte once…"):
            st.session_state[READ] = lm.quick("folder.read")            # bytes, seconds
    except EngineError as err:
        st.error(f"Reading the weights failed: {err}")


def timing_section(lm: ModelClient, report: FolderReport) -> None:
    cols = st.columns([1, 3])
    cols[0].metric("Load time", f"{lm.load_seconds:.2f} s",
                   help="Measured at start-up: config, weights and tokenizer, from this folder into memory.")
    if cols[1].button("Time reading the weight files", key="folder.read_button"):
        measure_read(lm)
    read = st.session_state.get(READ)
    target = MODEL_PRESETS[TARGET]
    nbytes = weight_bytes(target, "bf16")
    rows = {f"over {link.name} (projected, full rate)": pcie_seconds(nbytes, link) for link in PCIE.values()}
    if read:
        rate = read["bytes"] / read["seconds"]
        st.markdown(f"{MEASURED}: {fmt_bytes(read['bytes'])} read in {read['seconds']:.2f} s, "
                    f"**{rate / 1e9:,.2f} GB/s** (a second read often comes from the operating system's page cache, "
                    "so it is faster than the disk).")
        label = f"from this machine's storage (projected at the measured {rate / 1e9:,.2f} GB/s)"
        rows = {label: nbytes / rate, **rows}
    st.markdown(f"**{target.name} in BF16: {fmt_bytes(nbytes)} of weights.**")
    st.table({"moving the weights": list(rows), "time": [f"{s:,.2f} s" for s in rows.values()]})
    st.markdown("A PCIe link's rate follows from the standard: 32 GT/s per lane for PCIe 5.0 (16 for 4.0) x 16 lanes "
                "x 128/130 (the line code) ÷ 8 bits per byte, one way. The copy is rarely the slow part: reading the "
                "files from storage (or downloading them) usually takes longer, which is why servers keep weights on "
                "fast local disks and load them once.")
