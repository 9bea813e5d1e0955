"""``python -m rlhfctl.cli``: the same as the ``rlhfctl`` console script."""

from rlhfctl.cli import main

if __name__ == "__main__":
    main()
