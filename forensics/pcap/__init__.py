"""Reading capture files into packet columns (containers, link layers, IP/TCP headers)."""
from .decode import TcpDecoder, TcpPackets
from .reader import CaptureReader, RecordBatch

__all__ = ["CaptureReader", "RecordBatch", "TcpDecoder", "TcpPackets"]
