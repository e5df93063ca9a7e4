"""The domain layer: the rules of the pool that do not depend on how they are reached (HTTP) or
carried out (processes, pods): who may use which queue, what a request may ask for, a job's
lifecycle (every status change and reason), idle and run-time rules, usage reports, job tokens.
It imports the store layer and nothing above it (runtime, web).
"""
