"""A throwaway certificate authority for tests (valid two days): ``gpuledger_common.pki``'s."""

from __future__ import annotations

from gpuledger_common.pki import LOOPBACK, Issued, subject_names
from gpuledger_common.pki import CertificateAuthority as ThrowawayCa

__all__ = ["LOOPBACK", "Issued", "ThrowawayCa", "subject_names"]
