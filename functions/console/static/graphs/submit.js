// @ts-check
/**
 * In `duly dev`: "Create an example expense claim and submit it". The claim comes from the
 * dev app's own route (POST /dev/expense-claims); the submit is the page's submit form,
 * filled in and sent, so it goes through the same route and checks as a typed-in subject.
 */
(function () {
  "use strict";

  const example = /** @type {HTMLFormElement|null} */ (document.getElementById("example-form"));
  const submit = /** @type {HTMLFormElement|null} */ (document.getElementById("submit-form"));
  const status = document.getElementById("example-status");
  if (!example || !submit || !status) return;

  /** The console's CSRF token (a hidden field of the page's forms) as a request header. */
  function csrfHeaders() {
    const token = /** @type {HTMLInputElement|null} */ (document.querySelector('input[name="csrf_token"]'));
    return token ? { "X-CSRF-Token": token.value } : {};
  }

  /** The form control named `name` of the submit form. */
  function field(/** @type {string} */ name) {
    return /** @type {HTMLInputElement} */ (submit && submit.elements.namedItem(name));
  }

  /** The "on behalf of" field: only in open mode; with a credential, the principal submits. */
  const picker = /** @type {HTMLInputElement|null} */ (submit.elements.namedItem("user"));

  example.addEventListener("submit", async (event) => {
    event.preventDefault();
    const user = (picker && picker.value.trim()) || "sam";
    const amount = Number(/** @type {HTMLInputElement} */ (example.elements.namedItem("amount")).value) || 0;
    status.textContent = "Creating an example claim…";
    const response = await fetch(example.dataset.claimsUrl || "", {
      method: "POST",
      headers: { "Content-Type": "application/json", ...csrfHeaders() },
      body: JSON.stringify({ title: "Example claim", amount, submitted_by: user }),
    });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) {
      status.textContent = "The claim was not created: " + JSON.stringify(body.detail || response.status);
      return;
    }
    status.textContent = "Created claim " + body.subject_key + "; submitting it…";
    field("subject_type").value = body.subject_type;
    field("subject_key").value = body.subject_key;
    if (picker) picker.value = user;
    submit.requestSubmit();
  });
})();
