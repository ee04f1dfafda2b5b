// The console's only script of its own (htmx does the rest).
// A fragment marked data-poll asks for itself again every few seconds: not while its tab is
// hidden, so a console left open in the background costs the database nothing.
document.addEventListener("htmx:beforeRequest", function (event) {
  var element = event.detail && event.detail.elt;
  if (document.hidden && element && element.hasAttribute("data-poll")) {
    event.preventDefault();
  }
});
// Refresh a polled fragment at once when its tab comes back into view.
document.addEventListener("visibilitychange", function () {
  if (!document.hidden && window.htmx) {
    document.querySelectorAll("[data-poll]").forEach(function (element) {
      window.htmx.trigger(element, "console:visible");
    });
  }
});
// A polled fragment redrawn keeps the <details> the reader opened in it open.
var openDetails = [];
document.addEventListener("htmx:beforeSwap", function (event) {
  var target = event.detail && event.detail.target;
  openDetails = [];
  if (target && target.hasAttribute("data-poll")) {
    target.querySelectorAll("details[open][id]").forEach(function (element) {
      openDetails.push(element.id);
    });
  }
});
document.addEventListener("htmx:afterSwap", function () {
  openDetails.forEach(function (id) {
    var element = document.getElementById(id);
    if (element) {
      element.open = true;
    }
  });
  openDetails = [];
});
