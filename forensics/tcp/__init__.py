"""The TCP forensics engine: tshark-identical per-packet verdicts, per-flow summaries."""
from .engine import PACKET_COLUMNS, CaptureStats, TcpAnalysis, TcpAnalyzer, analyze_file

__all__ = ["PACKET_COLUMNS", "CaptureStats", "TcpAnalysis", "TcpAnalyzer", "analyze_file"]
