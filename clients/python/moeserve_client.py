"""A small Python client for moeserve's gRPC API (moeserve.v1.Moeserve).

Stubs are generated from server/proto/moeserve.proto on first import when missing or stale
(protoc and grpc_python_plugin come from apt; see gen_stubs.sh).

    from moeserve_client import Client
    with Client("127.0.0.1:50051") as c:
        for piece in c.generate_stream(text="Hello", max_tokens=16):
            print(piece.text, end="")
"""

import os
import subprocess
import sys

import grpc

_HERE = os.path.dirname(os.path.abspath(__file__))
_GEN = os.path.join(_HERE, "gen")
_PROTO = os.path.join(_HERE, "..", "..", "server", "proto", "moeserve.proto")


def _ensure_stubs():
    target = os.path.join(_GEN, "moeserve_pb2_grpc.py")
    if not os.path.exists(target) or os.path.getmtime(target) < os.path.getmtime(_PROTO):
        subprocess.run([os.path.join(_HERE, "gen_stubs.sh")], check=True, stdout=subprocess.DEVNULL)
    if _GEN not in sys.path:
        sys.path.insert(0, _GEN)


_ensure_stubs()
import moeserve_pb2 as pb  # noqa: E402
import moeserve_pb2_grpc as pb_grpc  # noqa: E402

PRIORITIES = {"normal": pb.PRIORITY_NORMAL, "fast": pb.PRIORITY_FAST, "high": pb.PRIORITY_HIGH,
              "low": pb.PRIORITY_LOW}


class Client:
    """One channel to a moeserve server; thread-safe like the gRPC channel under it."""

    def __init__(self, target="127.0.0.1:50051", api_key=None, root_certificates=None):
        if root_certificates is not None:
            creds = grpc.ssl_channel_credentials(root_certificates=root_certificates)
            self._channel = grpc.secure_channel(target, creds)
        else:
            self._channel = grpc.insecure_channel(target)
        self._stub = pb_grpc.MoeserveStub(self._channel)
        self._metadata = [("authorization", f"Bearer {api_key}")] if api_key else []

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @staticmethod
    def make_request(text=None, token_ids=None, max_tokens=16, temperature=0.0, top_k=0, top_p=None,
                     seed=None, stop_token_ids=(), priority="normal", logprobs=0, ignore_eos=False,
                     retain_seconds=0.0, stop=(), include_stop_str_in_output=False):
        if (text is None) == (token_ids is None):
            raise ValueError("give exactly one of text or token_ids")
        req = pb.GenerateRequest(max_tokens=max_tokens, stop_token_ids=list(stop_token_ids),
                                 priority=PRIORITIES[priority], logprobs=logprobs, ignore_eos=ignore_eos,
                                 retain_seconds=retain_seconds, stop=list(stop),
                                 include_stop_str_in_output=include_stop_str_in_output)
        if text is not None:
            req.text = text
        else:
            req.token_ids.ids.extend(token_ids)
        req.sampling.temperature = temperature
        req.sampling.top_k = top_k
        if top_p is not None:
            req.sampling.top_p = top_p
        if seed is not None:
            req.sampling.seed = seed
        return req

    def generate_stream(self, timeout=None, **kwargs):
        """Yields GenerateResponse messages as tokens arrive; the last carries finish_reason,
        usage and timing. Raises grpc.RpcError with the server's status on failure."""
        return self._stub.Generate(self.make_request(**kwargs), timeout=timeout, metadata=self._metadata)

    def generate(self, timeout=None, **kwargs):
        """Runs a request to the end; returns (token_ids, text, last_response)."""
        ids, text, last = [], [], None
        for r in self.generate_stream(timeout=timeout, **kwargs):
            ids.extend(r.token_ids)
            text.append(r.text)
            last = r
        return ids, "".join(text), last

    def model_info(self, timeout=10):
        return self._stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=timeout, metadata=self._metadata)

    def stats(self, timeout=10):
        return self._stub.GetStats(pb.GetStatsRequest(), timeout=timeout, metadata=self._metadata)
