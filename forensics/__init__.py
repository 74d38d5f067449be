"""stallscope's offline analyzer.

The package is laid out like its pipeline: ``pcap`` reads capture files into
columns, ``tcp`` runs the Wireshark-equivalent TCP analysis over them. The
command line (``forensics.cli``) is a thin layer over these modules.
"""
__version__ = "0.1.0"
