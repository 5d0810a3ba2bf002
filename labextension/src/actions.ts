/**
 * The kernel actions, in one table: what the button says, what the confirmation warns, and
 * the route the server takes (`POST /gpuctx/api/kernels/<id>/<api>`). The panel's buttons, the
 * confirmation dialog and the API call all read it, so they cannot drift apart.
 */
import { KernelAction } from './types';

export interface IKernelActionSpec {
  action: KernelAction;
  /** The button's text and the dialog's verb: "Shut down". */
  verb: string;
  /** What the confirmation warns will happen. */
  warning: string;
  /** The last segment of the server's route. */
  api: string;
}

/** In the order the buttons appear. */
export const KERNEL_ACTIONS: readonly IKernelActionSpec[] = [
  {
    action: 'interrupt',
    verb: 'Interrupt',
    warning: 'The running cell stops with KeyboardInterrupt.',
    api: 'interrupt'
  },
  {
    action: 'restart',
    verb: 'Restart',
    warning: 'All variables are lost and its GPU memory is released.',
    api: 'restart'
  },
  {
    action: 'shutdown',
    verb: 'Shut down',
    warning: 'All variables are lost and its GPU memory is released.',
    api: 'shutdown'
  }
];

export function actionSpec(action: KernelAction): IKernelActionSpec {
  const spec = KERNEL_ACTIONS.find(a => a.action === action);
  if (!spec) {
    throw new Error(`unknown kernel action '${action}'`);
  }
  return spec;
}

/** The words of one action on one notebook's kernel, for a button and its confirmation. */
export interface IActionWording {
  /** The button's accessible name and tooltip: "Shut down the kernel of train.ipynb". */
  label: string;
  /** The dialog's title: "Shut down kernel?". */
  title: string;
  /** The dialog's question: "Shut down the kernel of train.ipynb? All variables are lost…". */
  body: string;
  /** The failure's title: "Could not shut down the kernel of train.ipynb". */
  failure: string;
}

export function actionWording(action: KernelAction, target: string): IActionWording {
  const { verb, warning } = actionSpec(action);
  const label = `${verb} the kernel of ${target}`;
  return {
    label,
    title: `${verb} kernel?`,
    body: `${label}? ${warning}`,
    failure: `Could not ${verb.toLowerCase()} the kernel of ${target}`
  };
}
