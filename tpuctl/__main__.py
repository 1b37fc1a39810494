"""`python -m tpuctl`."""

from tpuctl.cli.main import console_main

if __name__ == "__main__":
    console_main()
