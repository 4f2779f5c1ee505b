"""python -m rqrl"""
from rqrl.cli import main

main()
