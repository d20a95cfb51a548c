"""atheris: the NRI wire decoder (mux frames, ttrpc frames, ttrpc messages) on arbitrary bytes, fed in
arbitrary pieces; the only failure it may report is ProtocolError (the agent then drops the connection
and dials again).

Run: python tests/fuzz/fuzz_nri.py -atheris_runs=20000   (tests/unit/test_fuzz.py does, bounded)
"""

from __future__ import annotations

import contextlib
import sys

import atheris

with atheris.instrument_imports():
    from google.protobuf.message import DecodeError

    from netclaim._proto import ttrpc_pb2
    from netclaim.adapters import nri
    from netclaim.errors import ProtocolError


def one_input(data: bytes) -> None:
    provider = atheris.FuzzedDataProvider(data)
    decoder = nri.MuxDecoder()
    try:
        while provider.remaining_bytes():
            piece = provider.ConsumeBytes(provider.ConsumeIntInRange(1, 64))
            for conn, _stream, kind, _flags, payload in decoder.feed(piece):
                if conn == nri.RUNTIME_CONN and kind == nri.RESPONSE:
                    nri.parse_response(payload)
                elif conn == nri.PLUGIN_CONN and kind == nri.REQUEST:
                    # as Connection._serve: a request that does not decode is answered with an error
                    with contextlib.suppress(DecodeError):
                        ttrpc_pb2.Request.FromString(payload)
    except ProtocolError:
        return


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
