#!/usr/bin/env python
import os
import sys

from vastmgr.lib.errors import SettingsError


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "vastmgr.settings")
    from django.core.management import execute_from_command_line


    try:
        execute_from_command_line(sys.argv)
    except SettingsError as exc:
        sys.exit(f"configuration error: {exc}")


if __name__ == "__main__":
    main()
