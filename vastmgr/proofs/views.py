from django.shortcuts import render

from .models import ProofJob


def proof_list(request):
    jobs = ProofJob.objects.select_related("machine")[:200]
    return render(request, "proofs/list.html", {"jobs": jobs})
