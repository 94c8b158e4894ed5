"""``python -m arceusd.worker --config <path.json>``: run one stage worker (``process.py``)."""

from arceusd.worker.process import main

if __name__ == "__main__":
    main()
