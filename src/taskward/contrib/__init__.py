"""Integrations with web frameworks (issue 29): ``taskward.contrib.django`` and
``taskward.contrib.fastapi``. Each imports its framework, so nothing else in taskward imports
them: a framework is needed only by the application that uses its integration."""
