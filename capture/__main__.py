"""``python3 -m capture``: stallscope's capture with the system interpreter, standard library only."""
import sys

from .cli import main

sys.exit(main())
