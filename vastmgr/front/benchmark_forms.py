"""The benchmark-proof form of an upstream cuzk daemon's machine page: the input (uploaded, or
a file on the dashboard's host) and the parameters SubmitProof needs."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from django import forms

from vastmgr.proofs.models import BenchmarkProof

GIB = 1 << 30
POST_KINDS = ("window-post", "winning-post")


class BenchmarkForm(forms.Form):
    proof_kind = forms.ChoiceField(choices=[(k, k) for k in BenchmarkProof.KINDS],
                                   initial="porep-c2")
    registered_proof = forms.IntegerField(
        min_value=0, initial=8,
        help_text="Upstream's numeric registered proof (RegisteredSealProof, RegisteredPoStProof "
                  "or RegisteredUpdateProof), e.g. 8 = StackedDrg32GiBV1_1")
    sector_size = forms.IntegerField(min_value=1, initial=32 * GIB, help_text="bytes")
    miner_id = forms.IntegerField(min_value=0, initial=1000)
    sector_number = forms.IntegerField(min_value=0, initial=1)
    randomness = forms.CharField(
        required=False, max_length=64,
        help_text="32 bytes in hex (the PoSt challenge seed); required for PoSt")
    partition_index = forms.IntegerField(min_value=0, initial=0, required=False)
    input_file = forms.FileField(required=False, label="C1 output / vanilla proof",
                                 help_text="At most 128 MiB (the daemon's message limit)")
    input_path = forms.CharField(required=False, max_length=500,
                                 label="or a file on the dashboard's host",
                                 help_text="Absolute path, readable by the dashboard")

    def clean_randomness(self) -> bytes:
        given = self.cleaned_data["randomness"].strip()
        try:
            value = bytes.fromhex(given)
        except ValueError:
            raise forms.ValidationError("randomness is 64 hex digits (32 bytes)") from None
        if given and len(value) != 32:
            raise forms.ValidationError(f"randomness is 32 bytes; this is {len(value)}")
        return value

    def _read_path(self, given: str) -> bytes:
        path = Path(given)
        if not path.is_absolute():
            raise forms.ValidationError("give the file's absolute path on the dashboard's host")
        try:
            mode = path.stat().st_mode
            if not stat.S_ISREG(mode):
                raise forms.ValidationError(f"{path} is not a file")
            if path.stat().st_size > BenchmarkProof.MAX_INPUT_BYTES:
                raise forms.ValidationError(f"{path} is above 128 MiB, the daemon's limit")
            return path.read_bytes()
        except OSError as exc:
            raise forms.ValidationError(f"{path}: {exc.strerror}") from None

    def clean(self) -> dict:
        data = super().clean() or {}
        upload, given = data.get("input_file"), (data.get("input_path") or "").strip()
        if bool(upload) == bool(given):
            raise forms.ValidationError("give the proof's input: upload a file or name one on "
                                        "the dashboard's host (one of the two)")
        if upload:
            if upload.size > BenchmarkProof.MAX_INPUT_BYTES:
                raise forms.ValidationError("the file is above 128 MiB, the daemon's limit")
            content, name = upload.read(), upload.name
        else:
            content, name = self._read_path(given), given
        if not content:
            raise forms.ValidationError(f"{name} is empty")
        kind = data.get("proof_kind")
        if kind == "porep-c2" and not _json_object(content):
            raise forms.ValidationError(f"{name} is not a PoRep C1 output (a JSON object)")
        if kind in POST_KINDS and not data.get("randomness"):
            self.add_error("randomness", "a PoSt proof needs its 32-byte randomness")
        data["input_bytes"], data["input_name"] = content, name
        data["partition_index"] = data.get("partition_index") or 0
        return data

    def benchmark_fields(self) -> dict:
        keys = ("proof_kind", "registered_proof", "sector_size", "miner_id", "sector_number",
                "randomness", "partition_index", "input_bytes", "input_name")
        return {key: self.cleaned_data[key] for key in keys}


def _json_object(content: bytes) -> bool:
    try:
        return isinstance(json.loads(content), dict)
    except (ValueError, UnicodeDecodeError):
        return False
