"""Helpers the tests import (tests/README.md): what several test files share and no test file owns."""
