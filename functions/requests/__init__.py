"""The one request layer under duly's front doors: HTTP, the console and the Lambda entries.

Each door parses its transport (a JSON body, a form, a direct event) into the
same request models and calls the same functions here, so a request is
accepted or refused by one set of rules, with one message, whichever door
it came through.
"""
